"""Writing a Bayesian network as a Pyro model: :class:`~pyro_flat.models.bnn.BNN` (network, prior
and likelihood in one line), the likelihoods, :func:`~pyro_flat.models.nn.make_bayesian` for a
plain ``torch.nn.Module``, and BatchNorm's running statistics."""
