import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

# scripts/gpu-check.sh runs the examples on CUDA: every tensor they create goes there.
if os.environ.get("VRAMLEAK_EXAMPLES_DEVICE"):
    torch.set_default_device(os.environ["VRAMLEAK_EXAMPLES_DEVICE"])
