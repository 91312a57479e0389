# Type stub of the compiled module, generated with pybind11-stubgen (regenerate after binding
# changes: pybind11-stubgen rlpar._native -o /tmp/stubs); tests/test_stub.py keeps it in sync.
"""
rlpar native core: shared nets, optimizers and snapshots (GIL released for work)
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['CategoricalSampler', 'FusedActorLoop', 'HeadSpec', 'LayerSpec', 'Net', 'NetSpec', 'RolloutInbox', 'Snapshot', 'SnapshotStore', 'StepLoop', 'Tape', 'TicketQueue', 'VecEnv', 'actor_critic_loss', 'adam_step', 'bench_snapshot', 'bench_snapshot_readers', 'check_fused_unroll', 'clip_by_global_norm', 'fused_unroll', 'gil_calibration', 'gil_meter', 'gil_release_threshold', 'global_norm', 'learn_loop', 'native_env_names', 'ppo_loss', 'rmsprop_step', 'set_gil_release_threshold', 'sgd_step']
def amx_available() -> bool:
    """
    True when this CPU and OS run Intel AMX-BF16 tiles, which LSTM(matmul='bf16x3') needs (False while RLPAR_DISABLE_AMX is set or RLPAR_MAX_ISA is below avx512).
    """
def build_arch() -> str:
    """
    The -march the native core was compiled for ('native', 'x86-64-v3', 'x86-64', ...).
    """
def simd_kernels() -> str:
    """
    Which of rlpar's register-blocked kernels run: 'avx512' (Conv2d, Linear and the LSTM cell), 'avx2' (Conv2d only, AVX2 + FMA: an -march=x86-64-v3 build, or RLPAR_MAX_ISA=avx2; Linear stays on Eigen), or '' (the portable Eigen path everywhere). The best that the build, the CPU and the environment variable RLPAR_MAX_ISA allow, chosen once.
    """

class ThreadPool:
    """
    Worker threads for intra-op parallelism of one caller's net calls.
    """
    def __init__(self, threads: int) -> None:
        ...
    @property
    def threads(self) -> int:
        ...

class LayerSpec:
    """
    One layer of a native NetSpec (rlpar/net.h LayerSpec).
    """
    @staticmethod
    def concat(branch_shapes: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]], branches: collections.abc.Sequence[collections.abc.Sequence[LayerSpec]]) -> LayerSpec:
        ...
    @staticmethod
    def conv2d(out_channels: typing.SupportsInt | typing.SupportsIndex, kernel: typing.SupportsInt | typing.SupportsIndex, stride: typing.SupportsInt | typing.SupportsIndex, padding: typing.SupportsInt | typing.SupportsIndex) -> LayerSpec:
        ...
    @staticmethod
    def embedding(num_embeddings: typing.SupportsInt | typing.SupportsIndex, dim: typing.SupportsInt | typing.SupportsIndex) -> LayerSpec:
        ...
    @staticmethod
    def flatten() -> LayerSpec:
        ...
    @staticmethod
    def layernorm(features: typing.SupportsInt | typing.SupportsIndex = 0) -> LayerSpec:
        ...
    @staticmethod
    def linear(out_features: typing.SupportsInt | typing.SupportsIndex) -> LayerSpec:
        ...
    @staticmethod
    def maxpool2d(kernel: typing.SupportsInt | typing.SupportsIndex, stride: typing.SupportsInt | typing.SupportsIndex, padding: typing.SupportsInt | typing.SupportsIndex) -> LayerSpec:
        ...
    @staticmethod
    def python(layer: typing.Any) -> LayerSpec:
        """
        A layer whose forward/backward are the object's methods.
        """
    @staticmethod
    def relu() -> LayerSpec:
        ...
    @staticmethod
    def residual(body: collections.abc.Sequence[LayerSpec]) -> LayerSpec:
        ...
    @staticmethod
    def tanh() -> LayerSpec:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def body(self) -> list[LayerSpec]:
        ...
    @property
    def branch_shapes(self) -> list[list[int]]:
        ...
    @property
    def branches(self) -> list[list[LayerSpec]]:
        ...
    @property
    def kernel(self) -> int:
        ...
    @property
    def kind(self) -> str:
        ...
    @property
    def num_embeddings(self) -> int:
        ...
    @property
    def out_channels(self) -> int:
        ...
    @property
    def out_features(self) -> int:
        ...
    @property
    def padding(self) -> int:
        ...
    @property
    def stride(self) -> int:
        ...
class FusedActorLoop:
    """
    An actor's whole loop over rlpar's native envs (rlpar/unroll.h, unroll_loop): take a free buffer's ticket, pin the store's latest snapshot, run a fused unroll into the buffer, write its stamp (version, seq), queue its out ticket; repeated without the GIL until run()'s time budget is spent. Built once per actor: the arrays are checked here and kept.
    """
    def __init__(self, envs: VecEnv, net: Net, store: SnapshotStore, sampler: typing.Any, free: TicketQueue, out: TicketQueue, buffers: collections.abc.Sequence, out_tickets: collections.abc.Sequence, ep_return: typing.Any, ep_length: typing.Any, prev_done: typing.Any, obs: typing.Any, state: typing.Any = None, starts: typing.Any = None, seq: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        buffers: objects with a rollout's arrays as attributes (rlpar.Rollout: obs, actions, rewards, terminated, truncated, mask, behaviour, core_state) and stamp int64 [2]; ticket i of `free` names buffers[i], which goes to `out` as out_tickets[i]. ep_return float64 [K], ep_length int64 [K] carry the episodes; prev_done bool [K] and obs [K, *obs_shape] receive the last step's ends and next input after each unroll; a recurrent net also carries state float32 [K, state_size] and starts bool [K].
        """
    def run(self, budget_s: typing.SupportsFloat | typing.SupportsIndex) -> tuple:
        """
        Unroll into free buffers for budget_s seconds (checked between unrolls), or until no buffer comes free within what is left of it. Returns (rollouts queued, [(return, length) of each episode that ended, in order], seconds spent waiting for a buffer).
        """
    @property
    def seq(self) -> int:
        """
        Rollouts made so far (the next seq).
        """

class HeadSpec:
    """
    One output head of a native NetSpec (rlpar/net.h HeadSpec).
    """
    @staticmethod
    def categorical(n: typing.SupportsInt | typing.SupportsIndex) -> HeadSpec:
        ...
    @staticmethod
    def gaussian(n: typing.SupportsInt | typing.SupportsIndex) -> HeadSpec:
        ...
    @staticmethod
    def value() -> HeadSpec:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def kind(self) -> str:
        ...
    @property
    def size(self) -> int:
        ...
class NetSpec:
    """
    A native net's architecture (rlpar/net.h NetSpec).
    """
    def __init__(self, input_shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], input_uint8: bool = False, input_scale: typing.SupportsFloat | typing.SupportsIndex = 1.0, layers: collections.abc.Sequence[LayerSpec] = [], heads: collections.abc.Sequence[HeadSpec] = [], lstm_hidden: typing.SupportsInt | typing.SupportsIndex = 0, lstm_bf16x3: bool = False) -> None:
        ...
    @property
    def heads(self) -> list[HeadSpec]:
        ...
    @property
    def input_scale(self) -> float:
        ...
    @property
    def input_shape(self) -> list[int]:
        ...
    @property
    def input_uint8(self) -> bool:
        ...
    @property
    def layers(self) -> list[LayerSpec]:
        ...
    @property
    def lstm_bf16x3(self) -> bool:
        ...
    @property
    def lstm_hidden(self) -> int:
        ...
class Tape:
    """
    Activations of one forward_train call, consumed by backward.
    """
    def release(self) -> None:
        """
        Give the workspace back to the net now instead of when the tape is collected.
        """
    @property
    def batch(self) -> int:
        ...
class Net:
    def __init__(self, spec: NetSpec) -> None:
        ...
    def backward(self, tape: Tape, dout: typing.Any, grad: typing.Any = None, accumulate: bool = False, release_gil: typing.Any = None, check_finite: bool = False, *, pool: ThreadPool | None = None) -> numpy.ndarray:
        ...
    def forward(self, params: typing.Any, obs: typing.Any, out: typing.Any = None, release_gil: typing.Any = None, check_finite: bool = False, *, state: typing.Any = None, resets: typing.Any = None, pool: ThreadPool | None = None) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def forward_train(self, params: typing.Any, obs: typing.Any, out: typing.Any = None, release_gil: typing.Any = None, check_finite: bool = False, *, state: typing.Any = None, resets: typing.Any = None, pool: ThreadPool | None = None) -> tuple[numpy.typing.NDArray[numpy.float32], Tape]:
        ...
    def torso_parts(self, pool: ThreadPool | None, batch: typing.SupportsInt) -> int:
        """
        How many parts a call with `pool` splits `batch` torso rows into (1: none; also for pool=None).
        """
    def workspace_stats(self) -> dict:
        ...
    @property
    def activation_shapes(self) -> list:
        ...
    @property
    def flops_per_sample(self) -> float:
        ...
    @property
    def input_shape(self) -> tuple:
        ...
    @property
    def input_uint8(self) -> bool:
        ...
    @property
    def native_spec(self) -> NetSpec:
        """
        The core's NetSpec this net was built from (a copy).
        """
    @property
    def num_params(self) -> int:
        ...
    @property
    def output_size(self) -> int:
        ...
    @property
    def outputs(self) -> list:
        ...
    @property
    def param_info(self) -> list:
        ...
    @property
    def recurrent(self) -> bool:
        ...
    @property
    def state_size(self) -> int:
        ...
class RolloutInbox:
    """
    The learner's take of a batch from the rollout inbox (rlpar/inbox.h): tickets popped from `inbox` (waiting without the GIL), each named buffer copied side by side into the batch arrays and handed back to its actor's free queue, with no Python per rollout. Register every buffer (add) before the first take; one thread takes.
    """
    def __init__(self, inbox: TicketQueue, layout: collections.abc.Sequence, env_axis: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        layout: one buffer's arrays (the rollout fields, in order); env_axis: the axis each is concatenated along in a batch (1 for [T, K, ...], 0 for a [K, S] core state).
        """
    def add(self, ticket: typing.SupportsInt | typing.SupportsIndex, arrays: collections.abc.Sequence, free: TicketQueue, free_ticket: typing.SupportsInt | typing.SupportsIndex, stamp: typing.Any) -> None:
        """
        Register the buffer `ticket` names on the inbox: its arrays (the layout's dtypes and shapes), the actor's free TicketQueue and its ticket there, and its stamp int64 [2] (stamp[0]: the version it was acted with).
        """
    def take(self, dst: collections.abc.Sequence, versions: typing.Any, start: typing.SupportsInt | typing.SupportsIndex, learner_version: typing.SupportsInt | typing.SupportsIndex, max_lag: typing.Any = None, timeout: typing.Any = None, release_gil: typing.Any = None) -> tuple:
        """
        Fill column blocks start .. B - 1 of the batch arrays `dst` (the layout's shapes with B times the env axis) and versions int64 [B] from the rollouts queued, waiting at most `timeout` seconds in all (None: no limit); a rollout more than max_lag versions behind learner_version is handed back unused. The copies run with the GIL released when release_gil is True (kept otherwise). Returns (columns filled, rollouts dropped).
        """
class Snapshot:
    """
    A pinned, immutable parameter snapshot. Pass it as `params` to Net.forward, or read `params` (a zero-copy read-only float32 view).
    """
    def __array__(self, *args, **kwargs) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def __enter__(self) -> typing.Any:
        ...
    def __exit__(self, *args) -> None:
        ...
    def release(self) -> None:
        """
        Drop this object's pin (views handed out keep theirs until they are collected).
        """
    @property
    def params(self) -> numpy.typing.NDArray[numpy.float32]:
        ...
    @property
    def size(self) -> int:
        ...
    @property
    def version(self) -> int:
        ...
class SnapshotStore:
    """
    Lock-free versioned parameter snapshots: one writer, many readers.
    """
    def __init__(self, size: typing.SupportsInt | typing.SupportsIndex, num_slots: typing.SupportsInt | typing.SupportsIndex = 8) -> None:
        ...
    def pin(self) -> Snapshot:
        ...
    def publish(self, params: typing.Any, version: typing.Any = None, release_gil: typing.Any = None) -> bool:
        """
        Copy params into a free slot and make it the latest version. Returns False (and counts a skip) when every spare slot is pinned; never waits.
        """
    @property
    def latest_version(self) -> int:
        ...
    @property
    def num_slots(self) -> int:
        ...
    @property
    def publishes(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
    @property
    def skipped(self) -> int:
        ...
class VecEnv:
    """
    K copies of one native game stepped in one call, with gymnasium's NEXT_STEP autoreset and one generator per env (see native/include/rlpar/envs.h).
    """
    def __init__(self, name: str, num_envs: typing.SupportsInt | typing.SupportsIndex, max_episode_steps: typing.Any = None) -> None:
        ...
    def get_state(self, index: typing.SupportsInt | typing.SupportsIndex) -> tuple[numpy.typing.NDArray[numpy.float64], int]:
        """
        (state float64 [state_size], steps since the reset) of env `index`.
        """
    def load_state(self, state: dict) -> None:
        """
        Put every env back in what save_state returned. Checks every array and env first (KeyError/TypeError/ValueError naming it); a refused state changes nothing.
        """
    def needs_reset(self, index: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        True when the env's next step is its reset step.
        """
    def observe(self) -> numpy.ndarray:
        """
        The observation each env returned last.
        """
    def reset(self, seeds: typing.Any = None) -> numpy.ndarray:
        """
        Reset every env; seeds: uint64 [K] reseeds env i with seeds[i] first (None: each env continues its stream). Returns obs [K, *obs_shape].
        """
    def save_state(self) -> dict:
        """
        The whole batch's state (for checkpoints), new arrays: {'game': float64 [K, state_size], 'rng': uint64 [K, 4], 'elapsed': int64 [K], 'needs_reset': bool [K]}.
        """
    def set_state(self, index: typing.SupportsInt | typing.SupportsIndex, state: typing.Any, elapsed: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        Put env `index` in `state` with `elapsed` steps since its reset; its next step is a normal step.
        """
    def step(self, actions: typing.Any, release_gil: typing.Any = None) -> tuple:
        """
        Step every env (NEXT_STEP autoreset). actions: integers [K] in [0, num_actions). Returns new arrays (obs [K, *obs_shape], rewards float32 [K], terminated bool [K], truncated bool [K]).
        """
    @property
    def flops_per_step(self) -> float:
        ...
    @property
    def max_episode_steps(self) -> int:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def num_actions(self) -> int:
        ...
    @property
    def num_envs(self) -> int:
        ...
    @property
    def obs_dtype(self) -> numpy.dtype[typing.Any]:
        ...
    @property
    def obs_high(self) -> numpy.ndarray:
        ...
    @property
    def obs_low(self) -> numpy.ndarray:
        ...
    @property
    def obs_shape(self) -> tuple:
        ...
    @property
    def state_size(self) -> int:
        ...
class CategoricalSampler:
    """
    Draws actions from categorical logits with its own xoshiro256** generator: the sampler of the fused unroll, also usable from Python (same draws from the same seed).
    """
    def __init__(self, seed: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def sample(self, logits: typing.Any) -> numpy.typing.NDArray[numpy.int64]:
        """
        One action per row of logits float32 [K, n] -> int64 [K].
        """
    @property
    def state(self) -> tuple:
        """
        The generator's state (4 ints), to save and restore.
        """
    @state.setter
    def state(self, arg1: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(4)"]) -> None:
        ...
class TicketQueue:
    """
    A FIFO of int tickets between threads (rlpar/ticket_queue.h) whose blocking waits and wake-ups run without the GIL; rlpar.runtime.handoff.HandOff carries Python objects through it. Once the interpreter exits, a wait gives up at once (as a timeout).
    """
    def __init__(self, maxsize: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        At most maxsize tickets queued (0: no bound).
        """
    def get(self, timeout: float | None = None) -> int | None:
        """
        The oldest ticket, waiting at most timeout seconds for one (None: no limit, 0: do not wait); None on timeout.
        """
    def put(self, ticket: typing.SupportsInt | typing.SupportsIndex, timeout: float | None = None) -> bool:
        """
        Append ticket, waiting at most timeout seconds for room (None: no limit, 0: do not wait). True if appended.
        """
    def qsize(self) -> int:
        """
        Tickets queued now.
        """
    @property
    def maxsize(self) -> int:
        ...
class LearnLoopResult:
    """
    What a learn_loop call did (read-only).
    """
    @property
    def applied(self) -> int:
        """
        Optimizer steps applied.
        """
    @property
    def batches(self) -> int:
        """
        Learner steps finished (each published).
        """
    @property
    def dropped(self) -> int:
        """
        Rollouts handed back unused: older than max_lag.
        """
    @property
    def filled(self) -> int:
        """
        Column blocks of a batch left part-taken in the batch's arrays.
        """
    @property
    def lag_max(self) -> int:
        """
        The last batch's largest policy lag.
        """
    @property
    def lag_mean(self) -> float:
        """
        The last batch's mean policy lag.
        """
    @property
    def learn_s(self) -> float:
        """
        Seconds in the optimizer steps.
        """
    @property
    def metrics(self) -> typing.Any:
        """
        The last step's loss metrics (a dict), None without a step.
        """
    @property
    def passes(self) -> tuple:
        """
        The last batch's steps: (grad_norm, applied) each.
        """
    @property
    def publish_s(self) -> float:
        """
        Seconds publishing.
        """
    @property
    def skipped_publishes(self) -> int:
        ...
    @property
    def take_s(self) -> float:
        """
        Seconds taking batches (waiting too).
        """
class TrainLoss:
    """
    A built-in loss for train_step (rlpar.NativeLoss builds it).
    """
    def __init__(self, kind: str, policy: str, policy_begin: typing.SupportsInt | typing.SupportsIndex, num_actions: typing.SupportsInt | typing.SupportsIndex, log_std_begin: typing.SupportsInt | typing.SupportsIndex, value_col: typing.SupportsInt | typing.SupportsIndex, action_dims: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], options: dict, low: typing.Any, high: typing.Any, bound_cost: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class StepLoop:
    """
    One actor's step loop over envs that step in Python: between two env steps, one call writes the step's results into the rollout, carries the episodes, runs the forward (GIL released above the work threshold) and, with a sampler, draws the next actions (rlpar/unroll.h). One loop per actor thread; calls from two threads at once raise.
    """
    def __init__(self, net: Net, num_envs: typing.SupportsInt | typing.SupportsIndex, sampler: typing.Any = None) -> None:
        """
        sampler: a CategoricalSampler drawing actions[t] from the net's one Categorical head, or None (the caller writes rollout.actions[t] after each act/step).
        """
    def act(self, t: typing.SupportsInt | typing.SupportsIndex, obs: typing.Any = None, begin: typing.SupportsInt | typing.SupportsIndex = 0, end: typing.SupportsInt | typing.SupportsIndex = -1) -> None:
        """
        Store obs [n, ...] (None: already stored) as obs[t] of envs [begin, end) (end -1: K) and act step t on them: behaviour[t] and, with a sampler, actions[t].
        """
    def act_async(self, t: typing.SupportsInt | typing.SupportsIndex, obs: typing.Any = None, begin: typing.SupportsInt | typing.SupportsIndex = 0, end: typing.SupportsInt | typing.SupportsIndex = -1) -> None:
        """
        act, with the forward and the draw on the loop's side thread: returns at once (after storing obs); the next call waits for it. Needs a sampler and a net without Python layers (can_act_async).
        """
    def begin(self, params: typing.Any, rollout: typing.Any, prev_done: typing.Any, ep_return: typing.Any, ep_length: typing.Any, state: typing.Any = None, starts: typing.Any = None) -> int:
        """
        Bind one unroll: params (a Snapshot or float32 [num_params], kept pinned until end), the rollout (an rlpar.Rollout: obs [T+1, K, ...] of the net's input dtype, actions int64 [T, K] with a sampler, rewards float32, terminated / truncated / mask bool [T, K], behaviour float32 [T, K, output_size], core_state), the episodes carried (prev_done bool [K], ep_return float64 [K], ep_length int64 [K], updated in place) and a recurrent net's state float32 [K, state_size] and starts bool [K] (their pending starts are applied and the state stored in rollout.core_state). Returns the params' version (0 for an array).
        """
    def end(self) -> tuple:
        """
        Unbind the unroll (after the act in flight). Returns ([(return, length) of each episode that ended], seconds spent inside this loop's calls since begin, waits for side-thread acts included).
        """
    def record(self, t: typing.SupportsInt | typing.SupportsIndex, obs: typing.Any, reward: typing.Any, terminated: typing.Any, truncated: typing.Any, begin: typing.SupportsInt | typing.SupportsIndex = 0, end: typing.SupportsInt | typing.SupportsIndex = -1) -> None:
        """
        Write the envs' results of step t ([n] each; any number or bool dtype, cast) and their next observations obs[t + 1], and carry their episodes.
        """
    def step(self, t: typing.SupportsInt | typing.SupportsIndex, obs: typing.Any, reward: typing.Any, terminated: typing.Any, truncated: typing.Any, begin: typing.SupportsInt | typing.SupportsIndex = 0, end: typing.SupportsInt | typing.SupportsIndex = -1) -> None:
        """
        record(t - 1, ...) then act(t): one call between env steps.
        """
    def step_async(self, t: typing.SupportsInt | typing.SupportsIndex, obs: typing.Any, reward: typing.Any, terminated: typing.Any, truncated: typing.Any, begin: typing.SupportsInt | typing.SupportsIndex = 0, end: typing.SupportsInt | typing.SupportsIndex = -1) -> None:
        """
        record(t - 1, ...) now, then act(t) on the side thread (act_async): for double buffering envs that step in this thread.
        """
    def wait(self) -> None:
        """
        Wait for the act in flight, if any, and raise its error. Every other call waits for it first too.
        """
    @property
    def bound(self) -> bool:
        ...
    @property
    def can_act_async(self) -> bool:
        """
        Whether act_async and step_async can run here: a sampler, and a net without Python layers.
        """
    @property
    def num_envs(self) -> int:
        ...
    @property
    def side_counts(self) -> tuple:
        """
        (acts submitted to the side thread, acts of those the calling thread ran itself because the side thread had not started them)
        """
def _stop_releasing_gil(timeout_s: typing.SupportsFloat | typing.SupportsIndex = 5.0) -> None:
    ...
def actor_critic_loss(out: typing.Any, behaviour: typing.Any, actions: typing.Any, rewards: typing.Any, terminated: typing.Any, truncated: typing.Any, mask: typing.Any, *, policy: str, policy_begin: typing.SupportsInt | typing.SupportsIndex, num_actions: typing.SupportsInt | typing.SupportsIndex, log_std_begin: typing.SupportsInt | typing.SupportsIndex, value_col: typing.SupportsInt | typing.SupportsIndex, action_dims: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], gamma: typing.SupportsFloat | typing.SupportsIndex, importance_weighting: bool, rho_bar: typing.SupportsFloat | typing.SupportsIndex, c_bar: typing.SupportsFloat | typing.SupportsIndex, pg_rho_bar: typing.SupportsFloat | typing.SupportsIndex, value_coef: typing.SupportsFloat | typing.SupportsIndex, entropy_coef: typing.SupportsFloat | typing.SupportsIndex) -> tuple[numpy.typing.NDArray[numpy.float32], dict]:
    """
    A3C (importance_weighting=False) or IMPALA V-trace loss and its gradient w.r.t. `out` [T+1, N, O]; see native/include/rlpar/losses.h. Returns (dout, metrics).
    """
def adam_step(params: typing.Any, grad: typing.Any, exp_avg: typing.Any, exp_avg_sq: typing.Any, step: typing.SupportsInt | typing.SupportsIndex, lr: typing.SupportsFloat | typing.SupportsIndex, beta1: typing.SupportsFloat | typing.SupportsIndex, beta2: typing.SupportsFloat | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, release_gil: typing.Any = None) -> None:
    ...
def bench_snapshot(n_floats: typing.SupportsInt | typing.SupportsIndex = 262144, iters: typing.SupportsInt | typing.SupportsIndex = 1000000, repeats: typing.SupportsInt | typing.SupportsIndex = 5) -> dict:
    ...
def bench_snapshot_readers(n_floats: typing.SupportsInt | typing.SupportsIndex, readers: typing.SupportsInt | typing.SupportsIndex, seconds: typing.SupportsFloat | typing.SupportsIndex) -> dict:
    """
    `readers` native threads pin + unpin in a loop for `seconds` while one thread publishes: total pins/s, publishes/s and the fraction of publishes skipped.
    """
def check_fused_unroll(envs: VecEnv, net: Net) -> None:
    """
    Raise ValueError (saying why) unless fused_unroll can run this net on these envs.
    """
def clip_by_global_norm(grad: typing.Any, max_norm: typing.SupportsFloat | typing.SupportsIndex) -> float:
    ...
def fused_unroll(envs: VecEnv, net: Net, params: typing.Any, sampler: CategoricalSampler, obs: typing.Any, actions: typing.Any, rewards: typing.Any, terminated: typing.Any, truncated: typing.Any, mask: typing.Any, behaviour: typing.Any, ep_return: typing.Any, ep_length: typing.Any, state: typing.Any = None, starts: typing.Any = None, core_state: typing.Any = None, release_gil: typing.Any = None) -> tuple:
    """
    One whole unroll of T steps over the K envs in one call (rlpar/unroll.h), written into the rollout arrays (obs [T+1, K, ...], actions int64 [T, K], rewards float32, terminated / truncated / mask bool [T, K], behaviour float32 [T, K, output_size]); ep_return float64 [K] and ep_length int64 [K] carry the episodes in progress. A recurrent net also takes state float32 [K, state_size] and starts bool [K] (the actor's carried core state and pending episode starts, updated in place) and writes the state fed into step 0 to core_state float32 [K, state_size]. Returns (version of params, [(return, length) of each episode that ended]).
    """
def gil_calibration() -> dict:
    """
    What the GIL release threshold was set from when rlpar was imported: {'handoff_ns': one hand-off between two sleeping threads, 'flops_per_ns': the kernels' speed on a small MLP, 'threshold_flops': 2 x their product within [70e3, 16e6]} (set_gil_release_threshold overrides it).
    """
def gil_meter() -> tuple:
    """
    The calling thread's GIL meter since it started: (seconds rlpar's calls ran with the GIL released, seconds they then waited to take it back, number of such calls, the thread's CPU seconds inside those calls).
    """
def gil_release_threshold() -> float:
    ...
def global_norm(grad: typing.Any) -> float:
    ...
def learn_loop(inbox: typing.Any, batch: typing.Any, names: collections.abc.Sequence, versions: typing.Any, start: typing.SupportsInt | typing.SupportsIndex, learner_version: typing.SupportsInt | typing.SupportsIndex, max_lag: typing.Any, net: Net, params: typing.Any, grad: typing.Any, loss: TrainLoss, *, passes: typing.SupportsInt | typing.SupportsIndex, max_grad_norm: typing.SupportsFloat | typing.SupportsIndex, optimizer: tuple, store: SnapshotStore, pool: typing.Any, budget_s: typing.SupportsFloat | typing.SupportsIndex, done: typing.Any) -> LearnLoopResult:
    """
    The learner's loop for an actor-critic loss as one call without the GIL, for up to budget_s seconds: take a batch of versions.shape[0] rollouts from inbox into batch's arrays (an rlpar.Batch; its fields names, in the inbox's layout order; from column block start), passes optimizer steps on it (passes = 0: none, an idle learner), publish the parameters to store as learner_version + 1, and again. Returns a LearnLoopResult. done (int64 [2]): batches and optimizer steps finished, also when a step raises.
    """
def native_env_names() -> list[str]:
    """
    Names of the games VecEnv can run.
    """
def ppo_loss(out: typing.Any, behaviour: typing.Any, actions: typing.Any, rewards: typing.Any, terminated: typing.Any, truncated: typing.Any, mask: typing.Any, *, policy: str, policy_begin: typing.SupportsInt | typing.SupportsIndex, num_actions: typing.SupportsInt | typing.SupportsIndex, log_std_begin: typing.SupportsInt | typing.SupportsIndex, value_col: typing.SupportsInt | typing.SupportsIndex, action_dims: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], gamma: typing.SupportsFloat | typing.SupportsIndex, rho_bar: typing.SupportsFloat | typing.SupportsIndex, c_bar: typing.SupportsFloat | typing.SupportsIndex, value_coef: typing.SupportsFloat | typing.SupportsIndex, entropy_coef: typing.SupportsFloat | typing.SupportsIndex, clip_eps: typing.SupportsFloat | typing.SupportsIndex, ratio_clip: str, advantage: str, gae_lambda: typing.SupportsFloat | typing.SupportsIndex, normalize_advantages: bool, value_clip: typing.SupportsFloat | typing.SupportsIndex, value_mean: typing.SupportsFloat | typing.SupportsIndex, value_std: typing.SupportsFloat | typing.SupportsIndex) -> tuple[numpy.typing.NDArray[numpy.float32], dict]:
    """
    PPO's clipped surrogate on V-trace or GAE(lambda) advantages against the behaviour policy, and its gradient w.r.t. `out` [T+1, N, O]; see native/include/rlpar/losses.h. Returns (dout, metrics).
    """
def train_step(net: Net, params: typing.Any, grad: typing.Any, loss: TrainLoss, batch: typing.Any, columns: typing.Any, *, value_mean: typing.SupportsFloat | typing.SupportsIndex, value_std: typing.SupportsFloat | typing.SupportsIndex, max_grad_norm: typing.SupportsFloat | typing.SupportsIndex, optimizer: tuple, pool: typing.Any) -> tuple:
    """
    One optimizer step of a built-in loss on a batch's columns (batch: an rlpar.Batch) as one call: gather, forward, loss, backward, clip, optimizer (native/include/rlpar/train_step.h). Returns (metrics, grad_norm, applied).
    """
def train_steps(net: Net, params: typing.Any, grad: typing.Any, loss: TrainLoss, batch: typing.Any, columns: collections.abc.Sequence, *, done: typing.Any, value_mean: typing.SupportsFloat | typing.SupportsIndex, value_std: typing.SupportsFloat | typing.SupportsIndex, max_grad_norm: typing.SupportsFloat | typing.SupportsIndex, optimizer: tuple, pool: typing.Any) -> list:
    """
    train_step on each of columns (a sequence of int64 [M] or None) in turn as one call (PPO's epochs x minibatches), the optimizer's step count advancing with each step taken; stops after a step whose gradient was not finite. done (int64 [1]) counts the steps finished, also when one raises. Returns a list of (metrics, grad_norm, applied), one per step run.
    """
def rmsprop_step(params: typing.Any, grad: typing.Any, square_avg: typing.Any, grad_avg: typing.Any, momentum_buffer: typing.Any, lr: typing.SupportsFloat | typing.SupportsIndex, alpha: typing.SupportsFloat | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, momentum: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, release_gil: typing.Any = None) -> None:
    ...
def set_gil_release_threshold(flops: typing.SupportsFloat | typing.SupportsIndex) -> None:
    ...
def sgd_step(params: typing.Any, grad: typing.Any, momentum_buffer: typing.Any, lr: typing.SupportsFloat | typing.SupportsIndex, momentum: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, nesterov: bool, release_gil: typing.Any = None) -> None:
    ...
