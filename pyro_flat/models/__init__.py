"""Writing a Bayesian network as a Pyro model: :class:`~pyro_flat.models.bnn.BNN` (network, prior
and likelihood in one line), the likelihoods, :func:`~pyro_flat.models.nn.make_bayesian` for a
plain ``torch.nn.Module``, BatchNorm's running statistics, and Bayesian fine-tuning of a trained
network (:mod:`~pyro_flat.models.finetune`: a head on a frozen backbone, or low-rank
adapters)."""
