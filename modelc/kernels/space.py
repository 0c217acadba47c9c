"""Config spaces in AutoTVM's vocabulary: define_split, define_knob, define_reorder, define_annotate.

A space is an ordered list of knobs, each with a finite list of candidate values; a config picks
one value per knob. Configs map to and from a single index (mixed radix over the knobs), serialise
to JSON, and describe themselves as a readable schedule. A template may declare a `constraint`
that rejects invalid combinations (e.g. a register tile that would not fit the registers).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ModelcError


def factorizations(n: int, parts: int, policy: str = "factors", max_factor: int | None = None) -> list:
    """Ways to tile an extent n into `parts` factors, outermost first.

    policy "factors": exact divisor chains; "power2": the inner factors are powers of two and the
    outermost is the ceil-divided rest, so an extent that is not a multiple keeps a remainder tile.
    `max_factor` bounds the inner factors.
    """
    def chains(m, k):
        if k == 1:
            return [(m,)]
        return [(d,) + rest for d in range(1, m + 1) if m % d == 0 for rest in chains(m // d, k - 1)]

    if policy == "power2":
        cands = [1 << i for i in range(max(1, n).bit_length()) if (1 << i) <= n]
        out = [(math.ceil(n / math.prod(inner)),) + inner
               for inner in itertools.product(cands, repeat=parts - 1) if math.prod(inner) <= n]
    else:
        out = chains(n, parts)
    if max_factor is not None:
        out = [v for v in out if max(v[1:], default=1) <= max_factor]
    return sorted(set(out))


@dataclass
class Knob:
    name: str
    kind: str          # split | knob | reorder | annotate
    values: list
    doc: str = ""
    absent: object = None   # what a config written before the knob existed means (None: no such config)

    def show(self, v) -> str:
        if self.kind == "split":
            return f"{self.name}: split {' x '.join(map(str, v))}"
        if self.kind == "reorder":
            return f"{self.name}: order {' > '.join(map(str, v))}"
        return f"{self.name} = {v}"


@dataclass
class ConfigSpace:
    knobs: list = field(default_factory=list)
    constraint: Callable | None = None

    def _add(self, knob: Knob):
        if any(k.name == knob.name for k in self.knobs):
            raise ModelcError(f"knob {knob.name!r} defined twice")
        if not knob.values:
            raise ModelcError(f"knob {knob.name!r} has no candidate values")
        self.knobs.append(knob)

    def define_split(self, name, extent: int, num_outputs: int = 2, policy: str = "factors",
                     max_factor: int | None = None, filter: Callable | None = None):
        vals = factorizations(int(extent), num_outputs, policy, max_factor)
        if filter is not None:
            vals = [v for v in vals if filter(v)] or vals[:1]
        self._add(Knob(name, "split", [list(v) for v in vals]))

    def define_knob(self, name, candidates, absent=None):
        """`absent`: as define_annotate's."""
        self._add(Knob(name, "knob", list(candidates), absent=absent))

    def define_reorder(self, name, axes, candidates=None):
        perms = candidates if candidates is not None else [list(p) for p in itertools.permutations(axes)]
        self._add(Knob(name, "reorder", [list(p) for p in perms]))

    def define_annotate(self, name, candidates, absent=None):
        """unroll / vectorize / parallel choices, e.g. ["none", "unroll"] or a list of axes.
        `absent`: the candidate that a config from before this knob existed stands for (its
        records then still load: tuning logs outlive the versions that wrote them)."""
        self._add(Knob(name, "annotate", list(candidates), absent=absent))

    def values(self, name) -> list:
        """The candidates of the knob `name`."""
        return next(k.values for k in self.knobs if k.name == name)

    # ---- indexing -------------------------------------------------------------------------
    def __len__(self):
        return math.prod(len(k.values) for k in self.knobs)

    @property
    def size(self) -> int:
        return len(self)

    def get(self, index: int) -> "Config":
        if not 0 <= index < len(self):
            raise ModelcError(f"config index {index} outside the space of {len(self)}")
        vals, rest = {}, index
        for k in self.knobs:
            rest, i = divmod(rest, len(k.values))
            vals[k.name] = k.values[i]
        return Config(self, index, vals)

    def from_values(self, values: dict) -> "Config":
        """The config of these knob values; each must be one of its knob's candidates (of the
        same type: JSON's 1.0 or true does not stand for the candidate 1), and the config holds
        the candidates themselves, so a template only ever sees values it declared."""
        index, mult, chosen = 0, 1, {}
        for k in self.knobs:
            if k.name not in values and k.absent is None:
                raise ModelcError(f"config lacks knob {k.name!r}")
            v = values.get(k.name, k.absent)
            v = list(v) if isinstance(v, tuple) else v
            i = next((j for j, c in enumerate(k.values) if _same(c, v)), None)
            if i is None:
                raise ModelcError(f"value {v!r} is not a candidate of knob {k.name!r}")
            chosen[k.name] = k.values[i]
            index += i * mult
            mult *= len(k.values)
        return Config(self, index, chosen)

    def is_valid(self, cfg: "Config") -> bool:
        return self.constraint is None or bool(self.constraint(cfg))

    def valid_indices(self, limit: int | None = None):
        """Indices of valid configs, in order (the whole space when it is small)."""
        out = []
        for i in range(len(self)):
            if self.is_valid(self.get(i)):
                out.append(i)
                if limit and len(out) >= limit:
                    break
        return out


def _kind(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "float"
    return type(v).__name__


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return _kind(a) == _kind(b) and a == b


@dataclass
class Config:
    space: ConfigSpace = field(repr=False)
    index: int
    values: dict

    def __getitem__(self, name):
        return self.values[name]

    def to_json(self) -> dict:
        return {"index": self.index, "values": self.values}

    def describe(self) -> str:
        """The config as a readable schedule, one knob per line."""
        return "\n".join(k.show(self.values[k.name]) for k in self.space.knobs)

    def __str__(self):
        return "; ".join(k.show(self.values[k.name]) for k in self.space.knobs)
