"""An fp16 O2 run reaches the fp32 run's loss on the demo task.

Tolerance: the O2 (float16 compute, dynamic scaling) loss on the whole
training set after 150 steps lies within 3% (relative) of the O0 (float32)
run's; measured difference on CPU: about 0.2%.
"""

import numpy as np
import pytest

from jax_amp_scale import demo

STEPS = 150
REL_TOL = 0.03


@pytest.mark.slow
@pytest.mark.trimmed
def test_o2_float16_matches_float32():
    fp32 = demo.train(STEPS, "O0", "none")
    fp16 = demo.train(STEPS, "O2", "auto", inject=(40, 41))
    assert fp16.skipped.sum() >= 2  # the injected overflows were skipped
    assert fp32.eval_loss < 0.5 * float(fp32.loss[0])  # the task is learned
    assert abs(fp16.eval_loss - fp32.eval_loss) <= REL_TOL * fp32.eval_loss, (
        fp16.eval_loss,
        fp32.eval_loss,
    )
    assert np.isfinite(fp16.loss[~fp16.skipped]).all()
