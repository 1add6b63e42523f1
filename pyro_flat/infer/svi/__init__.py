"""SVI tools: flat-seeking losses and averaging of variational parameters."""
