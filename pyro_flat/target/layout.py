"""Where each latent site lives in the kernel's flat parameter vector."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch.distributions import Transform
from torch.distributions.transforms import ComposeTransform, IndependentTransform


def is_identity_transform(transform: torch.distributions.Transform) -> bool:
    """Whether ``transform`` (from ``biject_to(support)``) leaves values as they are: the real
    line's empty composition, possibly wrapped in ``IndependentTransform``."""
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, ComposeTransform) and not transform.parts


@dataclass(frozen=True)
class Site:
    """One latent site: its slice of the flat vector and its bijection to the constrained space.

    ``shape`` is the shape of the *unconstrained* value that the flat vector holds; it differs
    from the site's own shape when the transform changes it (a simplex of 3 is held as 2
    numbers, a 3x3 LKJ Cholesky factor as 3). ``transform`` maps the unconstrained value to the
    constrained one (``biject_to(support)``); ``None`` means the identity (real support), which
    the hot path skips.
    """

    name: str
    shape: torch.Size
    offset: int
    transform: Transform | None = None

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def stop(self) -> int:
        return self.offset + self.numel


class FlatLayout:
    """An ordered set of :class:`Site` s packed one after another into one flat vector.

    Keeping all parameters in one contiguous buffer lets a kernel update every site with a few
    vectorised operations and draw all its noise with one ``randn`` call.
    """

    def __init__(self, sites: list[Site]):
        self.sites = sites
        self.size = sites[-1].stop if sites else 0
        self.names = [s.name for s in sites]

    @classmethod
    def from_shapes(
        cls, shapes: Mapping[str, torch.Size], transforms: Mapping[str, Transform] | None = None
    ) -> FlatLayout:
        transforms = transforms or {}
        sites, offset = [], 0
        for name, shape in shapes.items():
            site = Site(name, torch.Size(shape), offset, transforms.get(name))
            sites.append(site)
            offset = site.stop
        return cls(sites)

    @staticmethod
    def flat_dtype(values: Iterable[Mapping[str, torch.Tensor]]) -> torch.dtype:
        """The dtype of the flat vector: the widest floating dtype among the sites' values.

        A model mixes dtypes when, e.g., a float64 network has a noise scale whose prior was
        built in torch's default float32; the flat vector takes float64 then, so that no site
        loses precision and the network sees values of its own dtype. ``values``: one or more
        ``{site: value}`` (e.g. the initial values of each chain). Without a floating value,
        torch's default dtype.
        """
        dtype = None
        for one in values:
            for v in one.values():
                if torch.is_tensor(v) and v.is_floating_point():
                    dtype = v.dtype if dtype is None else torch.promote_types(dtype, v.dtype)
        return torch.get_default_dtype() if dtype is None else dtype

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-site views into ``flat`` (no copy)."""
        return {s.name: flat[s.offset : s.stop].view(s.shape) for s in self.sites}

    def flatten(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Concatenate per-site values into a new flat vector, in layout order."""
        missing = [n for n in self.names if n not in values]
        if missing:
            raise ValueError(f"initial_params is missing the sites {missing}")
        parts = []
        for s in self.sites:
            v = values[s.name]
            if v.shape != s.shape:
                raise ValueError(
                    f"site {s.name!r} has shape {tuple(s.shape)}, got a value of shape "
                    f"{tuple(v.shape)}"
                )
            parts.append(v.detach().reshape(-1))
        return torch.cat(parts) if parts else torch.zeros(0)

    def nonfinite_sites(self, flat: torch.Tensor) -> list[str]:
        """Names of the sites whose slice of ``flat`` holds a NaN or an infinity."""
        return [
            s.name for s in self.sites if not bool(torch.isfinite(flat[s.offset : s.stop]).all())
        ]

    def site_at(self, index: int) -> str:
        """The name of the site whose slice of the flat vector holds element ``index``."""
        return next(s.name for s in self.sites if s.offset <= index < s.stop)
