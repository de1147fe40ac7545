"""A catalogue of realistic training and inference loops, each labelled leaking or clean by construction.

Every loop runs under :class:`StepWatcher` on CPU at two settings, ``steps(10, warmup=2)`` and
``steps(20, warmup=5)``, and the step check's verdict must match the label. The labels are the
truth, not what some version of the rule happens to say:

- a leaking loop keeps adding tensor memory inside the measured window, through its last measured
  steps (every step, every third step, or every step from some point on);
- a clean loop does not keep growing by the end of the window: its memory is flat, goes up and
  down by the same amounts, or rises and then settles (a bounded buffer filling up, optimizer
  state created at the first real step, a cache filled during the first steps), or shows a single
  spike on the final step that the next step would free.

Each builder makes fresh state (model, optimizer, data, containers) with fixed seeds and returns
``step(i)``; it is told the run's number of steps, which a few loops need (a one-cycle schedule,
a phase that starts late in the run). Data comes from small pools made up front, so a step's
tensors are new only where the loop computes them.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pytest_vramleak import StepWatcher

Step = Callable[[int], None]


class Loop(NamedTuple):
    """One catalogue entry: ``build(steps)`` makes fresh state and returns ``step(i)``."""

    name: str
    build: Callable[[int], Step]
    leaks: bool
    pattern: str


CATALOGUE: list[Loop] = []


def loop(*, leaks: bool) -> Callable[[Callable[[int], Step]], Callable[[int], Step]]:
    """Register a builder under its function name, with its docstring as the pattern it shows."""

    def register(build: Callable[[int], Step]) -> Callable[[int], Step]:
        assert build.__doc__, f"{build.__name__} needs a one-line docstring"
        CATALOGUE.append(Loop(build.__name__, build, leaks, " ".join(build.__doc__.split())))
        return build

    return register


pytestmark = pytest.mark.usefixtures("one_torch_thread")


SETTINGS = [pytest.param(10, 2, id="steps10-warmup2"), pytest.param(20, 5, id="steps20-warmup5")]

FEATURES, CLASSES, BATCH = 32, 10, 16


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, CLASSES),
    )


class TinyTransformer(nn.Module):
    """One encoder layer over 16-token sequences of 32 features, mean-pooled into a classifier."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.TransformerEncoderLayer(FEATURES, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(tokens, src_mask=mask).mean(dim=1))


def classification_batches(count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, FEATURES, generator=generator), torch.randint(CLASSES, (BATCH,), generator=generator))
        for _ in range(count)
    ]


def image_batches(count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(2)
    return [
        (torch.randn(8, 3, 16, 16, generator=generator), torch.randint(CLASSES, (8,), generator=generator))
        for _ in range(count)
    ]


def sequence_batches(count: int = 4, length: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        (torch.randn(8, length, FEATURES, generator=generator), torch.randint(CLASSES, (8,), generator=generator))
        for _ in range(count)
    ]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One ordinary step: zero the gradients, backward, update; returns the loss (graph already freed)."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


# Clean loops: memory flat, up and down by the same amounts, or settling inside the window.


@loop(leaks=False)
def mlp_training_with_adam(steps: int) -> Step:
    """MLP classifier trained with Adam; its moments appear at the first step, during warm-up."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])

    return step


@loop(leaks=False)
def cnn_training_with_sgd_momentum(steps: int) -> Step:
    """Small CNN with BatchNorm trained with SGD and momentum; running stats update in place."""
    model, data = cnn(), image_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])

    return step


@loop(leaks=False)
def transformer_training_with_adamw(steps: int) -> Step:
    """One-layer transformer classifier trained with AdamW and gradient clipping."""
    model, data = TinyTransformer(), sequence_batches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


@loop(leaks=False)
def cnn_evaluation_under_inference_mode(steps: int) -> Step:
    """CNN evaluation under torch.inference_mode, accuracy counted as a Python int."""
    model, data = cnn().eval(), image_batches()
    correct = 0

    def step(i: int) -> None:
        nonlocal correct
        x, y = data[i % len(data)]
        with torch.inference_mode():
            correct += int((model(x).argmax(dim=1) == y).sum().item())

    return step


@loop(leaks=False)
def transformer_inference_under_no_grad(steps: int) -> Step:
    """Transformer inference under torch.no_grad, predictions kept as Python ints via tolist()."""
    model, data = TinyTransformer().eval(), sequence_batches()
    predictions: list[int] = []

    def step(i: int) -> None:
        with torch.no_grad():
            predictions.extend(model(data[i % len(data)][0]).argmax(dim=-1).tolist())

    return step


@loop(leaks=False)
def loss_metric_accumulated_with_item(steps: int) -> Step:
    """Running loss and per-step loss history kept as loss.item() floats."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history: list[float] = []

    def step(i: int) -> None:
        history.append(train_step(model, optimizer, *data[i % len(data)]).item())

    return step


@loop(leaks=False)
def bounded_replay_buffer_full_at_step_7(steps: int) -> Step:
    """Replay buffer deque(maxlen=8) of fresh rollouts: full after step 7, then each append evicts one."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    buffer: collections.deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = collections.deque(maxlen=8)
    environment = torch.Generator().manual_seed(4)
    sampler = random.Random(0)

    def step(i: int) -> None:
        observations = torch.randn(64, 16, generator=environment)
        with torch.no_grad():
            actions = policy(observations).argmax(dim=-1)
        buffer.append((observations, actions, torch.randn(64, generator=environment)))
        observations, actions, returns = buffer[sampler.randrange(len(buffer))]
        log_probs = policy(observations).log_softmax(dim=-1).gather(1, actions[:, None]).squeeze(1)
        optimizer.zero_grad()
        (-(log_probs * returns).mean()).backward()
        optimizer.step()

    return step


@loop(leaks=False)
def adamw_state_at_first_accumulated_step(steps: int) -> Step:
    """AdamW under gradient accumulation every 4 steps: its state appears at step 3, inside the window."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        (F.cross_entropy(model(x), y) / 4).backward()
        if i % 4 == 3:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


@loop(leaks=False)
def causal_mask_cache_filled_in_first_steps(steps: int) -> Step:
    """Causal masks cached per sequence length; five bucketed lengths fill the cache by step 4."""
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lengths = (8, 12, 16, 20, 24)
    data = [sequence_batches(1, length)[0] for length in lengths]
    masks: dict[int, torch.Tensor] = {}

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        length = x.shape[1]
        if length not in masks:
            masks[length] = nn.Transformer.generate_square_subsequent_mask(length)
        optimizer.zero_grad()
        F.cross_entropy(model(x, masks[length]), y).backward()
        optimizer.step()

    return step


@loop(leaks=False)
def gradient_accumulation_sawtooth(steps: int) -> Step:
    """SGD with gradients accumulated over 4 steps then set to None: memory goes up and down."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        (F.cross_entropy(model(x), y) / 4).backward()
        if i % 4 == 3:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


@loop(leaks=False)
def lstm_hidden_state_detached_each_step(steps: int) -> Step:
    """Truncated BPTT: an LSTM's hidden state carried across chunks and detached at each step."""
    torch.manual_seed(0)
    lstm, head = nn.LSTM(FEATURES, 32, batch_first=True), nn.Linear(32, 1)
    optimizer = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=1e-3)
    generator = torch.Generator().manual_seed(5)
    chunks = [(torch.randn(4, 8, FEATURES, generator=generator), torch.randn(4, 8, 1, generator=generator)) for _ in range(4)]
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None

    def step(i: int) -> None:
        nonlocal hidden
        x, y = chunks[i % len(chunks)]
        if hidden is not None:
            hidden = (hidden[0].detach(), hidden[1].detach())
        output, hidden = lstm(x, hidden)
        optimizer.zero_grad()
        F.mse_loss(head(output), y).backward()
        optimizer.step()

    return step


@loop(leaks=False)
def ema_copy_of_model(steps: int) -> Step:
    """An exponential moving average of the weights (AveragedModel) updated after every step."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.99))

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])
        ema.update_parameters(model)

    return step


@loop(leaks=False)
def one_cycle_lr_schedule(steps: int) -> Step:
    """SGD with momentum under a OneCycleLR schedule spanning the whole run."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=steps)

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])
        scheduler.step()

    return step


@loop(leaks=False)
def alternating_large_prefetch(steps: int) -> Step:
    """Even steps hold a 1 MiB prefetched batch that the following odd step consumes and frees."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(6)
    prefetched: dict[str, torch.Tensor] = {}

    def step(i: int) -> None:
        if i % 2 == 0:
            prefetched["batch"] = torch.randn(8192, FEATURES, generator=generator)
            train_step(model, optimizer, *data[i % len(data)])
        else:
            big = prefetched.pop("batch")
            train_step(model, optimizer, big[:BATCH], data[i % len(data)][1])

    return step


@loop(leaks=False)
def checkpoint_copy_every_tenth_step(steps: int) -> Step:
    """Every 10th step (the final step of both runs) keeps a state-dict copy that the next step frees."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    pending: dict[str, torch.Tensor] = {}

    def step(i: int) -> None:
        pending.clear()  # the writer has saved the previous checkpoint
        train_step(model, optimizer, *data[i % len(data)])
        if i % 10 == 9:
            pending.update({key: value.detach().clone() for key, value in model.state_dict().items()})

    return step


@loop(leaks=False)
def zero_grad_set_to_none_at_step_end(steps: int) -> Step:
    """zero_grad(set_to_none=True) after each update: gradients are freed between steps."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


@loop(leaks=False)
def zero_grad_keeping_zeros_at_step_end(steps: int) -> Step:
    """zero_grad(set_to_none=False) after each update: zeroed gradients stay allocated, reused in place."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    return step


@loop(leaks=False)
def best_model_state_replaced(steps: int) -> Step:
    """A copy of the best weights so far, replaced (not added to) whenever the loss improves."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    best_loss = float("inf")
    best_state: dict[str, torch.Tensor] = {}

    def step(i: int) -> None:
        nonlocal best_loss, best_state
        loss = train_step(model, optimizer, *data[i % len(data)]).item()
        if loss < best_loss:
            best_loss = loss
            best_state = {key: value.detach().clone() for key, value in model.state_dict().items()}

    return step


# Leaking loops: memory added within the measured window through its last measured steps.


@loop(leaks=True)
def eval_loss_summed_with_graph(steps: int) -> Step:
    """Validation without no_grad sums `total = total + loss`, keeping every step's graph and activations."""
    model, data = mlp().eval(), classification_batches()
    total: torch.Tensor | float = 0.0

    def step(i: int) -> None:
        nonlocal total
        x, y = data[i % len(data)]
        total = total + F.cross_entropy(model(x), y)

    return step


@loop(leaks=True)
def forward_hook_appends_activations(steps: int) -> Step:
    """A forward hook on the hidden layer appends every activation (detached) to a list."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    activations: list[torch.Tensor] = []
    model[1].register_forward_hook(lambda module, args, output: activations.append(output.detach()))

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])

    return step


@loop(leaks=True)
def unbounded_feature_cache_keyed_by_step(steps: int) -> Step:
    """Hidden features cached in a dict keyed by step number, never evicted."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cache: dict[int, torch.Tensor] = {}

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        features = model[1](model[0](x))
        cache[i] = features.detach()
        optimizer.zero_grad()
        F.cross_entropy(model[2](features), y).backward()
        optimizer.step()

    return step


@loop(leaks=True)
def predictions_concatenated_every_step(steps: int) -> Step:
    """`all_logits = torch.cat([all_logits, logits])` each step: no storage survives, the tensor grows."""
    model, data = mlp().eval(), classification_batches()
    all_logits = torch.empty(0, CLASSES)

    def step(i: int) -> None:
        nonlocal all_logits
        with torch.no_grad():
            all_logits = torch.cat([all_logits, model(data[i % len(data)][0])])

    return step


@loop(leaks=True)
def lstm_hidden_state_carried_without_detach(steps: int) -> Step:
    """Stateful LSTM scoring a stream without no_grad: the carried hidden state's graph grows each chunk."""
    torch.manual_seed(0)
    lstm, head = nn.LSTM(FEATURES, 32, batch_first=True).eval(), nn.Linear(32, CLASSES).eval()
    generator = torch.Generator().manual_seed(5)
    chunks = [torch.randn(4, 8, FEATURES, generator=generator) for _ in range(4)]
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None
    labels: list[int] = []

    def step(i: int) -> None:
        nonlocal hidden
        output, hidden = lstm(chunks[i % len(chunks)], hidden)
        labels.extend(head(output[:, -1]).argmax(dim=-1).tolist())

    return step


@loop(leaks=True)
def validation_outputs_kept_with_graph(steps: int) -> Step:
    """Validation outputs appended for metrics without no_grad, each with its autograd graph."""
    model, data = mlp().eval(), classification_batches()
    outputs: list[torch.Tensor] = []

    def step(i: int) -> None:
        outputs.append(model(data[i % len(data)][0]))

    return step


@loop(leaks=True)
def logits_logged_from_60_percent_of_run(steps: int) -> Step:
    """From 60% of the run on (step 6 of 10, 12 of 20), every step's logits are kept for a histogram."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = steps * 6 // 10
    logged: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        if i >= start:
            logged.append(logits.detach())

    return step


@loop(leaks=True)
def logits_logged_from_70_percent_of_run(steps: int) -> Step:
    """From 70% of the run on (step 7 of 10, 14 of 20: the later half), every step's logits are kept."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = steps * 7 // 10
    logged: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        if i >= start:
            logged.append(logits.detach())

    return step


@loop(leaks=True)
def embeddings_logged_every_third_step(steps: int) -> Step:
    """Every third step the batch's hidden features are kept for a projector view, never trimmed."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    projector: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        features = model[1](model[0](x))
        if i % 3 == 2:
            projector.append(features.detach())
        optimizer.zero_grad()
        F.cross_entropy(model[2](features), y).backward()
        optimizer.step()

    return step


@loop(leaks=True)
def loss_history_as_detached_tensors(steps: int) -> Step:
    """A very small leak: each step's loss kept as a detached 0-d tensor (4 bytes a step)."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history: list[torch.Tensor] = []

    def step(i: int) -> None:
        history.append(train_step(model, optimizer, *data[i % len(data)]).detach())

    return step


@loop(leaks=True)
def exceptions_stored_with_tracebacks(steps: int) -> Step:
    """A too-strict activation check raises every step; stored exceptions' tracebacks pin the activations."""
    model, data = mlp(), classification_batches()
    failures: list[Exception] = []

    def checked_hidden(x: torch.Tensor) -> torch.Tensor:
        hidden = model[1](model[0](x))
        if hidden.abs().max() > 0.0:
            raise FloatingPointError(f"activation {hidden.abs().max().item():.3f} over the limit 0.0")
        return hidden

    def step(i: int) -> None:
        try:
            checked_hidden(data[i % len(data)][0])
        except FloatingPointError as error:
            failures.append(error)

    return step


@loop(leaks=True)
def report_callback_per_step_captures_tensor(steps: int) -> Step:
    """Each step registers an end-of-epoch report callback whose closure captures that step's confidences."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    callbacks: list[Callable[[], float]] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        confidences = logits.detach().softmax(dim=-1)
        callbacks.append(lambda: confidences.max(dim=-1).values.mean().item())

    return step


@loop(leaks=True)
def auxiliary_losses_listed_with_graphs(steps: int) -> Step:
    """A logged auxiliary loss, never backpropagated, is appended to a list with its graph."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    targets = [F.one_hot(y, CLASSES).float() for _, y in data]
    auxiliary: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        auxiliary.append(F.l1_loss(logits.softmax(dim=-1), targets[i % len(data)]))

    return step


@loop(leaks=True)
def new_task_head_module_per_step(steps: int) -> Step:
    """Multi-task training creates a head per task id, and the task id is the step number."""
    model, data = mlp(), classification_batches()
    heads = nn.ModuleDict()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        heads[f"task_{i}"] = nn.Linear(CLASSES, CLASSES)
        optimizer = torch.optim.SGD([*model.parameters(), *heads[f"task_{i}"].parameters()], lr=0.1)
        optimizer.zero_grad()
        F.cross_entropy(heads[f"task_{i}"](model(x)), y).backward()
        optimizer.step()

    return step


@loop(leaks=True)
def prompt_parameter_added_per_step(steps: int) -> Step:
    """Prompt tuning adds a learnable token each step and registers it with Adam, which adds state too."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    prompts = nn.ParameterList()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        prompts.append(nn.Parameter(torch.zeros(1, FEATURES)))
        optimizer.add_param_group({"params": [prompts[-1]]})
        optimizer.zero_grad()
        F.cross_entropy(model(x + torch.cat(list(prompts)).sum(dim=0)), y).backward()
        optimizer.step()

    return step


@loop(leaks=True)
def gradient_snapshots_kept_for_norm_plot(steps: int) -> Step:
    """Gradients (not their norms) kept every step for a later plot; set_to_none makes them new each step."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gradient_history: list[list[torch.Tensor]] = []

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])
        gradient_history.append([p.grad for p in model.parameters() if p.grad is not None])

    return step


@loop(leaks=True)
def replay_buffer_without_maxlen(steps: int) -> Step:
    """A replay buffer deque() with no maxlen: every rollout is kept."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    buffer: collections.deque[tuple[torch.Tensor, torch.Tensor]] = collections.deque()
    environment = torch.Generator().manual_seed(4)

    def step(i: int) -> None:
        observations = torch.randn(64, 16, generator=environment)
        with torch.no_grad():
            buffer.append((observations, policy(observations).argmax(dim=-1)))

    return step


@loop(leaks=True)
def small_leak_under_accumulation_sawtooth(steps: int) -> Step:
    """A 4-byte loss tensor kept each step beneath a gradient-accumulation sawtooth of ~12 KiB."""
    model, data = mlp(), classification_batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        loss = F.cross_entropy(model(x), y) / 4
        loss.backward()
        losses.append(loss.detach())
        if i % 4 == 3:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def test_catalogue_is_balanced_and_described() -> None:
    names = [entry.name for entry in CATALOGUE]
    assert len(names) == len(set(names)) >= 32
    assert sum(entry.leaks for entry in CATALOGUE) * 2 == len(CATALOGUE), "half the loops should leak"
    assert all("\n" not in (entry.build.__doc__ or "\n").strip() for entry in CATALOGUE), "one-line docstrings"


@pytest.mark.parametrize(("steps", "warmup"), SETTINGS)
@pytest.mark.parametrize("entry", CATALOGUE, ids=[entry.name for entry in CATALOGUE])
def test_step_check_verdict_matches_label(entry: Loop, steps: int, warmup: int) -> None:
    step = entry.build(steps)
    result = StepWatcher("cpu", warmup=warmup).check(step, steps=steps)
    expected = "grows" if entry.leaks else "does not grow"
    got = "grows" if result.grows else "does not grow"
    assert result.grows == entry.leaks, (
        f"{entry.name}: {entry.pattern}\n"
        f"expected: memory {expected}; the step check says it {got} (steps({steps}, warmup={warmup}))\n"
        f"bytes above the warm-up baseline, measured steps: {result.steps}\n"
        f"warm-up steps: {result.warmup_steps}\n"
        f"{result.verdict.message}"
    )
