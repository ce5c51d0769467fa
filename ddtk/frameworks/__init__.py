"""The frameworks of lecture 03 and lab 02, run for real and measured side by side.

- :mod:`ddtk.frameworks.launchers`: run ``torchrun``, ``horovodrun``, ``deepspeed``
  and TensorFlow workers from Python with live output and no orphans.
- :mod:`ddtk.frameworks.horovod_timeline`: parse a Horovod timeline, time per phase, fused groups, plot.
- :mod:`ddtk.frameworks.horovod_knobs`: sweep ``HOROVOD_CYCLE_TIME`` and the fusion threshold under horovodrun.
- :mod:`ddtk.frameworks.ddp_internals`: DDP's real buckets, its flags and comm hooks, measured on ranks.
- :mod:`ddtk.frameworks.zero_memory`: DeepSpeed ZeRO 1/2/3 model-state bytes per rank vs the formula.
- :mod:`ddtk.frameworks.tf_mwms`: TensorFlow ``MultiWorkerMirroredStrategy`` workers, one process each.
- :mod:`ddtk.frameworks.state`: the model-state bytes a rank really holds, whatever the framework's layout.
- :mod:`ddtk.frameworks.recipes`: lines changed from single-process code, by ``difflib``.
- :mod:`ddtk.frameworks.compare_job` and :mod:`ddtk.frameworks.compare`: every framework on the
  same model, data and steps, interleaved (``ddtk bench frameworks``).

Every public name of these modules is importable from the package itself, loaded on
first use (so importing the package stays cheap).
"""

from ddtk._lazy import lazy_exports

# public name -> the submodule that defines it
_EXPORTS = {
    "add_derived": "compare",
    "plot": "compare",
    "run_comparison": "compare",
    "table": "compare",
    "tf_rows": "compare",
    "Contender": "compare_job",
    "batches": "compare_job",
    "build": "compare_job",
    "deepspeed_config": "compare_job",
    "init_groups": "compare_job",
    "parse_args": "compare_job",
    "CPU_HOOKS": "ddp_internals",
    "HOOKS": "ddp_internals",
    "bucket_trace": "ddp_internals",
    "flag_demo": "ddp_internals",
    "hook_benchmark": "ddp_internals",
    "planned_buckets": "ddp_internals",
    "run_bucket_trace": "ddp_internals",
    "run_flag_demo": "ddp_internals",
    "run_hook_benchmark": "ddp_internals",
    "run_tour": "ddp_internals",
    "tour": "ddp_internals",
    "DEFAULT_FUSION_BYTES": "horovod_knobs",
    "job_plan": "horovod_knobs",
    "run_sweep": "horovod_knobs",
    "FusedGroup": "horovod_timeline",
    "Interval": "horovod_timeline",
    "Timeline": "horovod_timeline",
    "fused_groups": "horovod_timeline",
    "load_timeline": "horovod_timeline",
    "parse_timeline": "horovod_timeline",
    "phase_summary": "horovod_timeline",
    "plot_timeline": "horovod_timeline",
    "Completed": "launchers",
    "LauncherError": "launchers",
    "free_port": "launchers",
    "horovodrun_command": "launchers",
    "run_command": "launchers",
    "tool": "launchers",
    "tool_env": "launchers",
    "torchrun_command": "launchers",
    "code_lines": "recipes",
    "lines_changed": "recipes",
    "unified_diff": "recipes",
    "state_bytes": "state",
    "run_workers": "tf_mwms",
    "covered_bytes": "zero_memory",
    "ddtk_zero_rows": "zero_memory",
    "ds_config": "zero_memory",
    "run_zero_memory": "zero_memory",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
