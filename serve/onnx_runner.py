"""The onnxruntime backend of perfmodel.serve.predictor.Predictor (a perfmodel.serve.runners.Runner): sessions
on the folder's model.onnx -- one per head, and per kernel mode the screened ranking graph and predict's graph,
each cut in a config stage and a problem stage -- and the stale-export check against the folder's weights
(_check_onnx_matches at load, _check_graphs when a kernel mode's graphs are prepared).
Imports neither Lightning, nor MLflow, nor pandas; onnxruntime and onnx only when a runner is built.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from perfmodel.artifact import ArtifactError, ModelBundle, mode_head, predict_head
from perfmodel.configs import pruned_space
from perfmodel.features import configs_tensor
from perfmodel.onnx_export import MODE_OUTPUTS, PREDICT_OUTPUTS, RANK_INPUTS, RANK_OUTPUTS
from perfmodel.ranking import refines

from .runners import _SERVING_THREADS, KERNELS, Runner, _ConfigPart, model_kernels

# Rows compared between the torch and ONNX graphs when an ONNX model is loaded (stale-export check).
_ONNX_CHECK_ROWS = 8
_ONNX_CHECK_RTOL = 1e-3
# Per kernel mode, the outputs of its ranking and predict graphs in model.onnx
_RANK_GRAPHS = {"autotune": RANK_OUTPUTS, **{k: rank for k, (rank, _) in MODE_OUTPUTS.items()}}
_PREDICT_GRAPHS = {"autotune": PREDICT_OUTPUTS, **{k: predict for k, (_, predict) in MODE_OUTPUTS.items()}}
# (problems x configs) rows from which the ranking and predict graphs run on the multi-threaded session
_WIDE_ROWS = 4096


class _OnnxRunner(Runner):
    """onnxruntime sessions on the folder's model.onnx: one per head (input <head>_x, outputs
    <head>_log_ms and <head>_score) and, per kernel mode, predict's graph and (with a screen head) the
    screened ranking graph (traced from perfmodel.ranking.screened_rank; the inductor mode's by a config
    network's inductor mode). It serves the "inductor" mode where the graph has that mode's graphs
    (perfmodel.onnx_export.export_onnx writes them for a model with a config network); a mode's graphs are cut from the file, given sessions and checked against the weights by
    prepare(kernel), when a Predictor for the mode is built. InferenceSession.run is thread-safe."""

    backend = "onnx"

    def __init__(self, bundle: ModelBundle, path: Path) -> None:
        import onnxruntime as ort

        if not path.is_file():
            raise FileNotFoundError(f"path_or_uri: {path.parent} has no {path.name} for backend='onnx' "
                                    f"(write it with `perfmodel export-onnx --model {path.parent}`)")
        self._ort, self._bundle, self._path = ort, bundle, path
        self.rank_keep, self.rank_width = None, 0
        # per kernel mode, its ranking and predict graphs (_Staged), built by prepare(kernel)
        self.rank_graphs: dict[str, _Staged] = {}
        self.predict_graphs: dict[str, _Staged] = {}
        self._prepared: set[str] = set()
        self._prepare_lock = threading.Lock()
        data = path.read_bytes()
        if not data:  # parsed, 0 bytes are an empty graph: say what is wrong, not which head is missing
            raise ArtifactError(f"{path}: the file is empty (0 bytes: corrupt or truncated); re-write it with "
                                f"`perfmodel export-onnx --model {path.parent}`, or load backend='torch'")
        try:
            head_graphs, self._cut, outputs = _split_graphs(data)
            # One session per head (small batches: a few threads, no inter-op pool), so that a call runs
            # only its head's nodes and never feeds the others an empty batch (onnxruntime on an H100
            # host died of SIGFPE on zero-row inputs).
            self.head_sessions = {name: self._session(graph, self._wide) for name, graph in head_graphs.items()}
        except Exception as exc:  # onnxruntime raises its own (non-public) exception types for bad graphs
            raise ArtifactError(f"{path}: not a loadable ONNX model ({type(exc).__name__}: {exc})") from None
        # the kernel modes whose ranking / predict graphs the file has
        self._has_rank = {k for k, names in _RANK_GRAPHS.items() if set(names) <= outputs}
        self._has_predict = {k for k, names in _PREDICT_GRAPHS.items() if set(names) <= outputs}
        if self._has_rank:
            self.rank_keep = bundle.screen_keep  # traced with it (perfmodel.onnx_export.export_onnx)
            # the columns it ranks: lead_keep with a lead, else screen_keep (checked on load)
            lead_keep = bundle.lead_keep
            self.rank_width = lead_keep if refines(lead_keep, self.rank_keep, lead_keep) else self.rank_keep
        self.widths, head_outputs = {}, set()
        for head, sess in self.head_sessions.items():
            (inp,) = sess.get_inputs()
            if inp.name != f"{head}_x":
                raise ArtifactError(f"{path}: unexpected ONNX input {inp.name!r}")
            self.widths[head] = inp.shape[1]
            head_outputs |= {o.name for o in sess.get_outputs()}
        for name in bundle.heads:  # (encoders may hold one by kind beside the heads': perfmodel.artifact.load)
            if self.widths.get(name) != len(bundle.encoders[name]) or not {f"{name}_log_ms", f"{name}_score"} <= head_outputs:
                raise ArtifactError(f"{path}: the ONNX graph does not match head {name!r} of the weights "
                                    f"(re-export with `perfmodel export-onnx`)")
        self.heads = frozenset(self.head_sessions)
        # A kernel mode is served when the file has its graphs: the inductor mode's are written for a model
        # with a config network (a file exported before them serves autotune only: Predictor
        # says so).
        self.kernels = frozenset(
            k for k in model_kernels(bundle)
            if k == KERNELS[0] or (mode_head(self.heads, k) and k in self._has_predict
                                   and (k in self._has_rank or not self._has_rank)))

    @property
    def _wide(self) -> int:
        return min(_SERVING_THREADS, os.cpu_count() or 1)

    def _session(self, graph: bytes, threads: int) -> Any:
        ort = self._ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        # No busy-waiting between calls: the predictor runs inside a compiler process, between
        # other work (torch's own threads among it) that spinning pool threads would slow down.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(graph, sess_options=opts, providers=["CPUExecutionProvider"])

    def prepare(self, kernel: str) -> None:
        """Build the kernel mode's ranking and predict graphs (once; a Predictor for the mode calls it
        when built) and check them against the folder's weights: a load for one mode pays for its
        graphs only."""
        with self._prepare_lock:
            if kernel in self._prepared or kernel not in self.kernels:
                return
            # The ranking and predict graphs get two sessions each: one thread for a few hundred rows (one
            # problem), where waking a pool thread costs more than it saves (measured: 1 thread 470-550 us,
            # 2 threads 525-690 us per 368-config rank), and the heads' threads for large batches.
            # Their own sessions: onnxruntime runs every node of a graph whatever outputs are asked for.
            def staged(names: tuple[str, ...]) -> _Staged:
                graph = self._cut(names)
                graph.config_session = self._session(graph.config_graph, 1) if graph.config_graph is not None else None
                wide = self._wide
                graph.sessions = _BySize(self._session(graph.problem_graph, 1),
                                         self._session(graph.problem_graph, wide) if wide > 1 else None)
                return graph

            try:
                rank = staged(_RANK_GRAPHS[kernel]) if kernel in self._has_rank else None
                predict = staged(_PREDICT_GRAPHS[kernel]) if kernel in self._has_predict else None
            except Exception as exc:  # onnxruntime's own (non-public) exception types for bad graphs
                raise ArtifactError(f"{self._path}: not a loadable ONNX model ({type(exc).__name__}: {exc})") from None
            _check_graphs(self._bundle, self, self._path, kernel, rank, predict)
            if rank is not None:
                self.rank_graphs[kernel] = rank
            if predict is not None:
                self.predict_graphs[kernel] = predict
            self._prepared.add(kernel)

    # the autotune mode's graphs, as before the inductor mode's existed
    @property
    def rank_session(self) -> "_Staged | None":
        return self.rank_graphs.get(KERNELS[0])

    @property
    def predict_session(self) -> "_Staged | None":
        return self.predict_graphs.get(KERNELS[0])

    def _run(self, names: list[str], head: str, x: torch.Tensor) -> list[np.ndarray]:
        if len(x) == 0:  # no rows: nothing to run (onnxruntime is never given an empty batch)
            width = {o.name: o.shape[1:] for o in self.head_sessions[head].get_outputs()}
            return [np.zeros((0, *width[n]), np.float32) for n in names]
        return self.head_sessions[head].run(names, {f"{head}_x": np.ascontiguousarray(x.numpy(), dtype=np.float32)})

    def score(self, head: str, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self._run([f"{head}_score"], head, x)[0])

    def score_log_ms(self, head: str, x: torch.Tensor, lead: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        if lead is not None:  # the ranking graph runs the lead (Predictor uses it whenever the lead refines)
            raise RuntimeError("the onnx backend's head sessions have no lead member")
        z, log_ms = self._run([f"{head}_score", f"{head}_log_ms"], head, x)
        return torch.from_numpy(z), torch.from_numpy(log_ms)

    def __call__(self, head: str, x: torch.Tensor) -> np.ndarray:
        return self._run([f"{head}_log_ms"], head, x)[0].astype(np.float64)

    def predicts(self, kernel: str) -> bool:
        return kernel in self.predict_graphs

    def predict(self, problems: np.ndarray, part: "_ConfigPart", kernel: str = KERNELS[0]) -> np.ndarray:
        graph = self.predict_graphs[kernel]
        return graph.run(graph.outputs, problems, part)[0]

    def ranks(self, kernel: str, keep: int, k: int) -> bool:
        # traced with the model's screen_keep, ranking rank_width columns
        return kernel in self.rank_graphs and keep == self.rank_keep and k <= self.rank_width

    def rank(self, problems: np.ndarray, part: "_ConfigPart", kernel: str = KERNELS[0]) -> tuple[np.ndarray, np.ndarray]:
        graph = self.rank_graphs[kernel]
        return graph.run(graph.outputs, problems, part)


class _BySize:
    """Two onnxruntime sessions on one graph: one thread (`small`) and several (`wide`, None on one
    core); get(rows) picks by the call's (problems x configs) rows."""

    def __init__(self, small: Any, wide: Any | None) -> None:
        self.small, self.wide = small, wide

    def get(self, rows: int) -> Any:
        return self.wide if self.wide is not None and rows >= _WIDE_ROWS else self.small



class _Staged:
    """A graph on RANK_INPUTS (the ranking or predict graph) cut in two stages: the config stage, every
    node that reads only the config inputs (and constants) -- in the ranking graph the config part
    through the screen's first layer, index arithmetic on the config count -- run once per config set;
    and the problem stage, the rest, run per call on rank_problems and the config stage's outputs. The
    same nodes as the whole graph, so the same results; a call runs ~20 us less of them (368 configs).
    config_session and sessions (a _BySize on problem_graph) are set by the runner."""

    def __init__(self, config_graph: bytes | None, problem_graph: bytes, boundary: list[str],
                 outputs: tuple[str, ...]) -> None:
        self.config_graph, self.problem_graph, self.boundary = config_graph, problem_graph, boundary
        self.outputs = list(outputs)  # a list, as the binding takes them
        # the boundary tensors the config stage computes (the others are config inputs, fed as they are)
        self.computed = [n for n in boundary if n not in RANK_INPUTS]
        self.config_session: Any = None
        self.sessions: _BySize | None = None

    def feeds(self, part: _ConfigPart) -> dict[str, np.ndarray]:
        """The problem stage's config feeds for a config set: computed once, then kept on the part (a
        thread racing another computes the same arrays; the dict keeps one)."""
        got = part.staged.get(self)
        if got is None:
            got = {n: part.feeds[n] for n in self.boundary if n in RANK_INPUTS}
            if self.computed:
                got.update(zip(self.computed, self.config_session.run(
                    self.computed, {n: part.feeds[n] for n in RANK_INPUTS[1:]})))
            part.staged[self] = got
        return got

    def run(self, outputs: list[str], problems: np.ndarray, part: _ConfigPart) -> list[np.ndarray]:
        rows = problems.shape[0] * part.n_configs
        feeds = self.feeds(part).copy()
        feeds["rank_problems"] = problems
        return _run_session(self.sessions.get(rows), outputs, feeds)


def _run_session(session: Any, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """session.run(outputs, feeds), without InferenceSession.run's Python-side check of the feed names
    (~6 us a call: the staged graphs' feeds are built here, their names fixed) where onnxruntime has
    its binding (`_sess`)."""
    sess = getattr(session, "_sess", None)
    if sess is None:
        return session.run(outputs, feeds)
    return sess.run(outputs, feeds, None)


def _split_graphs(model_bytes: bytes) -> tuple[dict[str, bytes], Callable[[tuple[str, ...]], "_Staged"], set[str]]:
    """({head: its graph}, cut, the graph's output names) of a model.onnx: one graph per head, so that no
    call runs another's nodes (input <head>_x, outputs <head>_score and <head>_log_ms, those the model
    has); cut(outputs) extracts the graph of a ranking or predict output set, in its config and problem
    stages (_Staged)."""
    import onnx
    from onnx.utils import Extractor

    # shapes inferred: the stages' boundary tensors need their types to become graph inputs and outputs
    model = onnx.shape_inference.infer_shapes(onnx.load_from_string(model_bytes))
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    extractor = Extractor(model)
    heads = {}
    for name in inputs:
        if name in RANK_INPUTS:
            continue
        head = name.removesuffix("_x")
        heads[head] = extractor.extract_model(
            [name], [n for n in (f"{head}_score", f"{head}_log_ms") if n in outputs]).SerializeToString()

    def cut(names: tuple[str, ...]) -> _Staged:
        graph = extractor.extract_model(list(RANK_INPUTS), list(names)).graph
        boundary = _config_boundary(graph, names)
        computed = [n for n in boundary if n not in RANK_INPUTS]
        config = extractor.extract_model(list(RANK_INPUTS[1:]), computed).SerializeToString() if computed else None
        problem = extractor.extract_model([RANK_INPUTS[0], *boundary], list(names)).SerializeToString()
        return _Staged(config, problem, boundary, names)

    has_inputs = all(n in inputs for n in RANK_INPUTS)
    graphs = {n for names in (*_RANK_GRAPHS.values(), *_PREDICT_GRAPHS.values()) for n in names}
    return heads, cut, set(outputs) if has_inputs else set(outputs) - graphs


def _config_boundary(graph: Any, outputs: tuple[str, ...]) -> list[str]:
    """The tensors of a graph on RANK_INPUTS that depend on the config inputs only (not on rank_problems,
    and not constants) and that a node depending on rank_problems reads: the config stage's outputs,
    the problem stage's inputs besides rank_problems (_Staged)."""
    const = {i.name for i in graph.initializer} | {""}  # "": an omitted optional input
    config = set(RANK_INPUTS[1:])
    problem_nodes = []
    for node in graph.node:  # topological order
        if any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute):  # a subgraph: left to the problem stage
            reads_problem = True
        elif all(i in const for i in node.input):
            reads_problem = node.op_type != "Constant" and not node.input  # a source that is no constant
            if not reads_problem:
                const.update(node.output)
                continue
        else:
            reads_problem = not all(i in const or i in config for i in node.input)
        if reads_problem:
            problem_nodes.append(node)
        else:
            config.update(node.output)
    if any(o in config for o in outputs):
        return list(RANK_INPUTS[1:])  # an output of configs alone: no cut (never so in an exported graph)
    boundary: dict[str, None] = {}
    for node in problem_nodes:
        boundary.update((i, None) for i in node.input if i in config)
    return list(boundary)


def _onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _check_onnx_matches(bundle: ModelBundle, runner: _OnnxRunner, path: Path) -> None:
    """A model.onnx exported from other weights than the folder's safetensors would silently serve a
    different model: compare a few rows of every head against the torch weights (each kernel mode's
    ranking and predict graphs: _check_graphs, when the runner prepares them)."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, head in bundle.heads.items():
            x = head.x_mean + head.x_std * torch.randn(_ONNX_CHECK_ROWS, head.cfg.n_inputs, generator=gen)
            want = head(x).numpy().astype(np.float64)
            got = runner(name, x)
            if got.shape != want.shape or not np.allclose(got, want, rtol=_ONNX_CHECK_RTOL, atol=1e-4):
                raise ArtifactError(f"{path}: head {name!r} of the ONNX graph disagrees with the folder's "
                                    "weights (stale export?); re-run `perfmodel export-onnx`")
    if bundle.lead_keep and KERNELS[0] not in runner._has_rank:
        raise ArtifactError(f"{path}: the folder has a lead_keep but its ONNX graph no ranking graph; re-run "
                            "`perfmodel export-onnx`")
    if runner._has_rank and (bundle.screen_name is None or runner.rank_keep != bundle.screen_keep):
        raise ArtifactError(f"{path}: the ONNX ranking graph does not match the folder's screen head or "
                            "screen_keep; re-run `perfmodel export-onnx`")


def _check_graphs(bundle: ModelBundle, runner: _OnnxRunner, path: Path, kernel: str,
                  rank: _Staged | None, predict: _Staged | None) -> None:
    """A kernel mode's ranking and predict graphs against the torch rule on the folder's weights (one
    problem, the fp16 space): the same log ms, the ranking sorted and drawn from the screen's best."""
    if rank is None and predict is None:
        return
    enc, gemm = bundle.encoders["gemm"], bundle.heads["gemm"]
    modes = kernel != KERNELS[0] and mode_head(bundle.heads, kernel) is not None
    if modes:  # the mode's head (a config network's inductor mode, the inductor or tutorial head) in place of gemm
        gemm = bundle.heads[mode_head(bundle.heads, kernel)]
    problems = torch.tensor([[3000.0, 1000, 777, 2, 0, 0, 0, 1]], dtype=torch.float64)
    configs = configs_tensor(pruned_space("float16", bundle.spec))
    part = _ConfigPart.of(enc, configs)
    with torch.inference_mode():
        x = enc.encode_cross(problems, configs)
        if predict is not None:
            got = predict.run(predict.outputs, problems.numpy(), part)[0][0]
            want = (gemm(x) if modes else bundle.heads[predict_head(bundle.heads)](x)).numpy()
            if got.shape != want.shape or not np.allclose(got, want, rtol=_ONNX_CHECK_RTOL, atol=1e-4):
                raise ArtifactError(f"{path}: the ONNX predict graph disagrees with the folder's weights "
                                    f"(kernel={kernel!r}; stale export?); re-run `perfmodel export-onnx`")
        if rank is not None:
            kept, log_ms = rank.run(rank.outputs, problems.numpy(), part)
            if kept.shape[1] != runner.rank_width:
                raise ArtifactError(f"{path}: the ONNX ranking graph ranks {kept.shape[1]} configs per problem, the "
                                    f"folder's lead_keep / screen_keep {runner.rank_width}; re-run `perfmodel export-onnx`")
            idx = torch.from_numpy(kept[0])
            rows = x[idx]
            score = gemm.score(rows)
            want = gemm.floor(score, rows)
            screen = bundle.heads[bundle.screen_name](x).numpy()
            if not np.allclose(log_ms[0], want.numpy(), rtol=_ONNX_CHECK_RTOL, atol=1e-4) or \
                    np.any(np.diff(log_ms[0]) < 0) or \
                    screen[kept[0]].max() > np.sort(screen)[runner.rank_keep - 1] + 1e-4:
                raise ArtifactError(f"{path}: the ONNX ranking graph disagrees with the folder's weights "
                                    f"(kernel={kernel!r}; stale export?); re-run `perfmodel export-onnx`")
