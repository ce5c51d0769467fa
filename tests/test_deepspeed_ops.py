"""ddtk.frameworks.deepspeed_ops: DeepSpeed's CPU shared-memory op is built (or loaded) ahead of use.

``make test`` starts the build in the background; here it is asked for again, which
waits on DeepSpeed's own lock if that build is still running, and loads the cached op.
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_op_deepspeed_loads_on_a_cpu_is_built() -> None:
    from ddtk.frameworks.deepspeed_ops import build

    said = build()
    assert "deepspeed_shm_comm ready in" in said or "needs no shared-memory op" in said, said
