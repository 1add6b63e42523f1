"""Keeping the draws of a run: export to ArviZ and per-draw statistics
(:mod:`~pyro_flat.draws.export`), streaming them to disk while the chain runs
(:mod:`~pyro_flat.draws.streaming`), the files on disk and reading them back
(:mod:`~pyro_flat.draws.files`), and an ``MCMC`` that keeps them in one buffer
(:mod:`~pyro_flat.draws.lean_mcmc`). The names most users need are re-exported by
:mod:`pyro_flat`."""
