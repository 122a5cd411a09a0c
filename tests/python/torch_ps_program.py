"""What torch_ps_worker.py trains, which test_torch_ps.py's reference trains again in one
process: the model, the steps' batches and the optimizer's settings."""
import torch

STEPS = 20
LR = 0.05
MOMENTUM = 0.9
TRUE_MAP = torch.arange(24, dtype=torch.float32).reshape(3, 8) / 24 - 0.5


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 3)


def batch(step):
    """Step `step`'s global batch of 16 rows: inputs and their targets."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=g)
    return x, x @ TRUE_MAP.T + 0.1
