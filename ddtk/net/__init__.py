"""Networks: what real clusters are made of, and how to make local ranks feel one.

- :mod:`~ddtk.net.units`: rates and durations as vendors write them (``"400Gbit"``, ``"2us"``).
- :mod:`~ddtk.net.topology`: a cluster as data (GPUs, NVLink or PCIe, NICs, switch tiers),
  with presets for common systems, each number with its source.
- :mod:`~ddtk.net.predict`: time and bus bandwidth of the collectives on such a cluster,
  per algorithm (ring, double binary tree, two hierarchical forms, in-network reduction), and the
  link that limits them.
- :mod:`~ddtk.net.published`: published nccl-tests measurements and the model's error on them.
- :mod:`~ddtk.net.emulate`: a bandwidth and a latency per pair of local ranks, inside ddtk's
  transport (portable).
- :mod:`~ddtk.net.shaping`: ranks in network namespaces behind kernel rate limiters
  (root only), and ``iperf3`` on those links.
- :mod:`~ddtk.net.probe`: per-link timing that finds a slow link.
- :mod:`~ddtk.net.nccl_tests`, :mod:`~ddtk.net.nccl_log`, :mod:`~ddtk.net.ibv_devinfo`,
  :mod:`~ddtk.net.perftest`: the outputs of nccl-tests, ``NCCL_DEBUG=INFO``, ``ibv_devinfo``
  and ``ib_write_bw`` as data; :mod:`~ddtk.net.rdma_check`: what those four outputs say
  is misconfigured, and the fix.

Every public name of these modules is importable from the package itself, loaded on
first use (so importing the package stays cheap), except those of the output parsers
``nccl_log``, ``ibv_devinfo`` and ``perftest``, which each have a ``parse``: use them
through their module (``from ddtk.net import ibv_devinfo``, then ``ibv_devinfo.parse``).
The package's own ``parse`` and ``check`` are those of :mod:`~ddtk.net.nccl_tests`.
"""

from ddtk._lazy import lazy_exports

# public name -> the submodule that defines it
_EXPORTS = {
    "EmulatedNetwork": "emulate",
    "EmulatedTransport": "emulate",
    "LinkSpec": "emulate",
    "TokenBucket": "emulate",
    "sleep_until": "emulate",
    "crossover_from_times": "measure",
    "emulated_crossover": "measure",
    "fit_link": "measure",
    "link_times": "measure",
    "loopback_check": "measure",
    "pattern_times": "measure",
    "reduce_rate": "measure",
    "timed_together": "measure",
    "check": "nccl_tests",
    "parse": "nccl_tests",
    "FIXES": "rdma_check",
    "MIN_FRACTION": "rdma_check",
    "Finding": "rdma_check",
    "busbw_findings": "rdma_check",
    "diagnose_rdma": "rdma_check",
    "link_findings": "rdma_check",
    "nccl_findings": "rdma_check",
    "port_findings": "rdma_check",
    "Prediction": "predict",
    "applicable": "predict",
    "crossover": "predict",
    "SlowLink": "probe",
    "diagnose": "probe",
    "find_slow_links": "probe",
    "probe_links": "probe",
    "round_robin": "probe",
    "Check": "published",
    "Published": "published",
    "is_large": "published",
    "summary": "published",
    "table": "published",
    "validate": "published",
    "ShapedNetwork": "shaping",
    "ShapingUnavailable": "shaping",
    "iperf3": "shaping",
    "join_namespace": "shaping",
    "loopback_iperf3": "shaping",
    "sweep_stale": "shaping",
    "unavailable_reason": "shaping",
    "Cluster": "topology",
    "Link": "topology",
    "Protocol": "topology",
    "loopback": "topology",
    "preset": "topology",
    "format_rate": "units",
    "format_time": "units",
    "parse_rate": "units",
    "parse_time": "units",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
