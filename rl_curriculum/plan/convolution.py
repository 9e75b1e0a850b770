"""How many taps of a convolution's window meet input elements, for counting its FLOPs.

XLA:TPU writes many matmuls as convolutions: batched matmuls with their batch dimensions as
spatial dimensions dilated so that each output meets one input element, and projections whose
window (the heads) passes over one input element padded on both sides. Such a window's size is
not the work it does; the taps that land on input elements, not on padding nor between the
elements of a dilated input, are (`roofline`).
"""

import re

import numpy as np


def taps(attrs: str, lhs_labels: str, out_labels: str, lhs: list, out: list) -> float:
  """The mean over a convolution's output positions of the window taps that land on input
  elements (not on padding, nor between the elements of a dilated input)."""
  window = re.search(r"window=\{([^}]*)\}", attrs)
  if not window:
    return 1.0
  field = lambda key, default: ([[int(v) for v in x.split("_")] if "_" in x else int(x)
                                 for x in m.group(1).split("x")]
                                if (m := re.search(key + r"=([\d_x]+)", window.group(1)))
                                else default)
  sizes = field("size", [])
  n = len(sizes)
  pads, strides = field("pad", [[0, 0]] * n), field("stride", [1] * n)
  lhs_dilate, rhs_dilate = field("lhs_dilate", [1] * n), field("rhs_dilate", [1] * n)
  mean = 1.0
  for d in range(n):
    if str(d) not in lhs_labels or str(d) not in out_labels:
      return float(np.prod(sizes))
    size, outputs = lhs[lhs_labels.index(str(d))], out[out_labels.index(str(d))]
    position = (np.arange(outputs)[:, None] * strides[d]
                + np.arange(sizes[d])[None, :] * rhs_dilate[d] - pads[d][0])
    real = ((position >= 0) & (position <= (size - 1) * lhs_dilate[d])
            & (position % lhs_dilate[d] == 0))
    mean *= real.sum() / outputs
  return mean
