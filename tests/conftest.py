import os
import sys

import torch

# ``import harness`` from any test module, and from spawned worker processes (they inherit sys.path)
sys.path.insert(0, os.path.dirname(__file__))

torch.set_num_threads(1)

