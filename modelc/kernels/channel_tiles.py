"""Which channel-vector tiles a grouped (or odd-width) convolution can take in conv_generic's "oc"
formulation, and in which the layout pass may keep it blocked: whole vectors within a group, pair tiles
over two groups' halves, tiles past the last channel, and tiles within a group whose last one is part
zero weights."""
from __future__ import annotations

from .. import target
from .workload import Workload

PAIR = 16                    # channels of a tile spanning two groups (halves split at PAIR // 2)


def channel_vectors(kg: int) -> bool:
    """Whether a group of `kg` output channels takes the channel-vector tile ("oc"): 8k of them
    (the layout pass keeps such grouped convs in the blocked layout)."""
    return kg % 8 == 0


def wide_tile(wl: Workload, g) -> bool:
    """Whether a tile of PAIR channels may reach past a group's channels (PAIR not dividing them):
    - grouped, groups of 8 channels times an odd number (RegNet's widths of 8, ShuffleNet v1's 136):
      the tile holds two groups' halves, which fill only half of an AVX-512 vector each, and LLVM
      would not vectorise a tile of 8 channels at all (scalar FMAs; with reassociation it vectorised
      the input-channel loop and spilled): ShuffleNet v1's 1x1 conv 544 -> 544 in 4 groups on 7x7
      0.236 -> 0.082 ms, RegNetY's 3x3 208 -> 208 in 26 groups on 14x14 0.094 -> 0.076 ms;
    - ungrouped, any number of channels from 8: the last tile runs past them (R(2+1)D's 3-d convs to
      230, 460 and 921 channels ran their rows with 4-channel tiles: 1x3x3 64 -> 230 on 16x56x56
      126-162 ms, onnxruntime 17.5).
    Past the last channel the tile reads zero weights, so the bias must be packed too."""
    if not _const(wl, wl.anchor.args[1]) or g.transpose or g.Kg % PAIR == 0:
        return False
    if g.K == g.Kg:
        ok = g.K >= PAIR // 2
    else:
        ok = g.Kg % (PAIR // 2) == 0
    bias = wl.anchor.args[2] if len(wl.anchor.args) > 2 else ""
    return ok and (g.K % PAIR == 0 or not bias or _const(wl, bias))


def padded_tiles(wl: Workload, g) -> list:
    """Tiles of several channel vectors within a group, its last tile partly zero weights: groups of
    8 x odd channels (RegNetY-8GF's 56) on AVX-512 otherwise take pair tiles, whose FMAs each blend
    two groups' inputs. Only tiles wasting at most a third of their lanes, from two vectors on."""
    lanes = target.current().lanes(4)
    bias = wl.anchor.args[2] if len(wl.anchor.args) > 2 else ""
    if not _const(wl, wl.anchor.args[1]) or g.transpose or (bias and not _const(wl, bias)) or g.Kg < 2 * lanes:
        return []
    return [t for t in range(2 * lanes, 4 * lanes + 1, lanes)
            if t > PAIR and g.Kg % t and -(-g.Kg // t) * t <= g.Kg * 4 // 3]


def _const(wl: Workload, ref: str) -> bool:
    return ref.startswith("p") or wl.inputs[int(ref[1:])].const


def oc_possible(wl: Workload, g) -> bool:
    """Channel vectors need a packable (constant) weight and 8k output channels per group, or a
    tile that may run past them."""
    return not g.transpose and _const(wl, wl.anchor.args[1]) and (
        channel_vectors(g.Kg) or wide_tile(wl, g) or bool(padded_tiles(wl, g)))
