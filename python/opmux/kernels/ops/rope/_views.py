"""The escape hatch of rope's contract (``Arg.view``): query / key as [tokens, H, head_size]
views, the head count read from a hidden size that is ``[H * head_size]`` or ``[H, head_size]``
(a shape cannot state it). Authoritative; the lane's counterpart is ``lane::heads_view``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _checks

if TYPE_CHECKING:
    from torch import Tensor


def heads(op: str, name: str, t: Tensor, positions: Tensor, head_size: int) -> Tensor:
    """``t`` (positions' shape, then [H * head_size] or [H, head_size]) as its [tokens, H,
    head_size] view, never a copy; a [T, H, head_size] one with a unit last stride as it is."""
    shape, lead = t.shape, positions.dim()
    if shape[:lead] != positions.shape:
        raise ValueError(
            f"{op}: {name} has shape {tuple(shape)}; its leading dims must be positions' {tuple(positions.shape)}"
        )
    rest = shape[lead:]
    if len(rest) == 2 and rest[1] == head_size:
        if lead == 1 and (head_size <= 1 or t.stride()[2] == 1):
            return t  # the serving form: its own view
        num = rest[0]
    elif len(rest) == 1 and rest[0] % head_size == 0:
        num = rest[0] // head_size
    else:
        raise ValueError(
            f"{op}: {name} has shape {tuple(shape)}; expected positions' shape followed by "
            f"[num_heads * head_size] or [num_heads, head_size] with head_size {head_size}"
        )
    return _checks.heads(op, name, t, positions.numel(), num, head_size)
