"""``grad_generator(loss, params)``: the gradients of `loss` for `params`, last first.

  TE-15 ``grad_generator(loss, params)`` yields one handle per parameter, in reverse order of
    `params` (the order backward produces them); each is d(loss)/d(param) on every proc, as
    ``torch.autograd.grad`` computes it. The backward ops are issued once, as commands.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

import torch


def grad_generator(loss: torch.Tensor, params: Sequence[torch.Tensor],
                   grad: Optional[torch.Tensor] = None) -> Iterator[torch.Tensor]:
    params = list(params)
    grads = torch.autograd.grad(loss, params, grad_outputs=grad, allow_unused=True)
    for g in reversed(grads):
        yield g
