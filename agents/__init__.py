"""Built-in agents, written against the public `rlpar` API only (the proof that a user's agent
is a first-class citizen): importing this package registers them."""

from rlpar.registry import register_agent

from .a3c import A3C, A3CConfig
from .impala import Impala, ImpalaConfig

register_agent("a3c", A3C, A3CConfig, overwrite=True, source="built-in")
register_agent("impala", Impala, ImpalaConfig, overwrite=True, source="built-in")

__all__ = ["A3C", "A3CConfig", "Impala", "ImpalaConfig"]
