"""rlhfkit: the RLHF pipeline of Huang et al. 2024, every implementation detail named and tested."""

__version__ = "0.1.0"
