"""Stand-in for TransferQueue (verl 0.9.1's V1 trainer imports it: trainer/main_ppo.py:137); nothing more."""

__version__ = "0.1.10"
