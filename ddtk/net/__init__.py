"""Networks: what real clusters are made of, and how to make local ranks feel one.

- :mod:`~ddtk.net.units`: rates and durations as vendors write them (``"400Gbit"``, ``"2us"``).
- :mod:`~ddtk.net.topology`: a cluster as data (GPUs, NVLink or PCIe, NICs, switch tiers),
  with presets for common systems, each number with its source.
- :mod:`~ddtk.net.predict`: time and bus bandwidth of the collectives on such a cluster,
  per algorithm (ring, double binary tree, hierarchical, in-network reduction), and the
  link that limits them.
- :mod:`~ddtk.net.published`: published nccl-tests measurements and the model's error on them.
- :mod:`~ddtk.net.emulate`: a bandwidth and a latency per pair of local ranks, inside ddtk's
  transport (portable).
- :mod:`~ddtk.net.shaping`: ranks in network namespaces behind kernel rate limiters
  (root only), and ``iperf3`` on those links.
- :mod:`~ddtk.net.probe`: per-link timing that finds a slow link.
"""
