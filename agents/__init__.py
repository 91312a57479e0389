"""Built-in agents, written against the public `rlpar` API only (the proof that a user's agent
is a first-class citizen). rlpar finds them as it finds a user's: through entry points of the
group "rlpar.agents" (`rlpar.registry.BUILT_IN_AGENTS`); importing this package registers
nothing."""

from .a3c import A3C, A3CConfig
from .appo import Appo, AppoConfig
from .impala import Impala, ImpalaConfig

__all__ = ["A3C", "A3CConfig", "Appo", "AppoConfig", "Impala", "ImpalaConfig"]
