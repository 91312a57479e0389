"""Every ``rlpar bench`` command: each returns a JSON-ready dict of medians.

- `rlpar.bench.net`: the native net against numpy and torch twins, thread scaling, the GIL
  threshold, the snapshot store;
- `rlpar.bench.envs`: native vs gymnasium (and EnvPool) envs, the actor loop;
- `rlpar.bench.runtime`: the whole actor/learner runtime; `rlpar.bench.ray`: Ray vs threads;
- `rlpar.bench.scaling`: every threaded path at 1..N threads;
- `rlpar.bench.timing`: the one timing toolkit they share (side by side, medians);
- `rlpar.bench.twins` (numpy and torch twins of a net) and `rlpar.bench.workloads` (inputs,
  batches, an acting-only policy): the other pieces several benchmarks share.

``rlpar train`` imports none of this: the command line imports a benchmark when it runs one.
"""
