"""More loops for the step check, in leaking and clean twins: GANs, VAEs, contrastive memory banks,
WGAN-GP, MAML, REINFORCE, KV-cache decoding, SWA, pruning, distillation, metric objects, hooks,
variable-length batches, data-dependent routing, gradients set to None, periodic clearing and
1 MiB feature maps.

Most are noisy: the batch, episode or sequence a step used is kept until the next step rebinds it
(as a loop written inline keeps it), and its size varies with the data, so the figure after each
step moves by more than some leaks add. Each runs over 10 data seeds at the settings of
:mod:`tests.loops`. A leaking twin keeps adding through every step it runs, whatever the seed
draws: every step, or every other step; a clean twin's memory is flat, varies, or is cleared or
replaced periodically.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune
from torch.nn.utils.rnn import pack_padded_sequence

from .loops import (
    BATCH,
    CLASSES,
    FEATURES,
    SETTING_PARAMS,
    Catalogue,
    Loop,
    Run,
    Setting,
    Step,
    check_catalogue_entry,
    classification_batches,
    init,
    mlp,
    sampler,
    seeded,
    train_step,
)

CATALOGUE = Catalogue()
loop = CATALOGUE.loop

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# GAN: a generator and a discriminator trained in turn.


def gan(run: Run, keep_samples: bool) -> Step:
    init(run)
    generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimize_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimize_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    noise = seeded(run, 10)
    real = [torch.randn(16, 16, generator=noise) + 2 for _ in range(4)]
    samples: list[torch.Tensor] = []
    ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)

    def step(i: int) -> None:
        fake = generator(torch.randn(16, 8, generator=noise))
        d_loss = F.binary_cross_entropy_with_logits(
            discriminator(real[i % 4]), ones
        ) + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
        optimize_d.zero_grad()
        d_loss.backward()
        optimize_d.step()
        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        optimize_g.zero_grad()
        g_loss.backward()
        optimize_g.step()
        if keep_samples:
            samples.append(fake)  # for an image grid, with the generator's graph

    return step


@loop(leaks=False)
def gan_training_with_detached_fakes(run: Run) -> Step:
    """GAN: the discriminator sees fake.detach(), the generator then steps through the discriminator."""
    return gan(run, keep_samples=False)


@loop(leaks=True)
def gan_samples_kept_with_graph_for_a_grid(run: Run) -> Step:
    """GAN keeping each step's generated batch (1 KiB) for an image grid, without detach: graph and all."""
    return gan(run, keep_samples=True)


# VAE on batches of varying size.


class TinyVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.decoder = (
            nn.Linear(FEATURES, 2 * 4),
            nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, FEATURES)),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean, log_variance = self.encoder(x).chunk(2, dim=-1)
        z = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
        return self.decoder(z), mean, log_variance


def vae(run: Run, keep_means: bool) -> Step:
    init(run)
    model = TinyVAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data, sizes = seeded(run, 11), sampler(run, 12)
    last: dict[str, torch.Tensor] = {}
    means: list[torch.Tensor] = []

    def step(i: int) -> None:
        x = torch.randn(sizes.randint(4, 48), FEATURES, generator=data)
        reconstruction, mean, log_variance = model(x)
        kl = -0.5 * (1 + log_variance - mean.pow(2) - log_variance.exp()).sum(-1).mean()
        loss = F.mse_loss(reconstruction, x) + kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last.update(x=x, reconstruction=reconstruction)  # what an inline loop holds until its next step
        if keep_means:
            means.append(mean.detach())  # 16 bytes a row: 64 B to 768 B a step

    return step


@loop(leaks=False)
def vae_on_batches_of_4_to_48_rows(run: Run) -> Step:
    """VAE trained on batches of 4 to 48 rows, the last batch and reconstruction held until the next step."""
    return vae(run, keep_means=False)


@loop(leaks=True)
def vae_latent_means_kept_for_a_plot(run: Run) -> Step:
    """VAE on batches of 4 to 48 rows keeping each batch's latent means (64 B to 768 B a step) for a plot."""
    return vae(run, keep_means=True)


# Contrastive learning with a memory bank of negatives (MoCo).


def contrastive(run: Run, concatenate: bool) -> Step:
    init(run)
    query_encoder = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 16))
    key_encoder = copy.deepcopy(query_encoder).requires_grad_(False)
    optimizer = torch.optim.SGD(query_encoder.parameters(), lr=0.05, momentum=0.9)
    data = seeded(run, 13)
    batches = [torch.randn(16, FEATURES, generator=data) for _ in range(4)]
    bank, pointer = F.normalize(torch.randn(64, 16, generator=data), dim=1), 0

    def step(i: int) -> None:
        nonlocal bank, pointer
        x = batches[i % 4]
        noisy = x + 0.1 * torch.randn(x.shape, generator=data)
        queries = F.normalize(query_encoder(x), dim=1)
        with torch.no_grad():
            for key_weight, query_weight in zip(key_encoder.parameters(), query_encoder.parameters(), strict=False):
                key_weight.mul_(0.99).add_(query_weight, alpha=0.01)
            keys = F.normalize(key_encoder(noisy), dim=1)
        logits = torch.cat([(queries * keys).sum(1, keepdim=True), queries @ bank.t()], dim=1) / 0.07
        loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if concatenate:  # the bank is meant to keep the last 64 keys, and is never cut
            bank = torch.cat([bank, keys])
        else:
            bank[pointer : pointer + len(keys)] = keys
            pointer = (pointer + len(keys)) % len(bank)

    return step


@loop(leaks=False)
def contrastive_memory_bank_as_a_ring_buffer(run: Run) -> Step:
    """MoCo: keys from a momentum encoder overwrite the oldest rows of a fixed 64-row bank of negatives."""
    return contrastive(run, concatenate=False)


@loop(leaks=True)
def contrastive_memory_bank_concatenated_never_cut(run: Run) -> Step:
    """MoCo whose bank is `torch.cat([bank, keys])` each step and never cut: one tensor, 1 KiB bigger each step."""
    return contrastive(run, concatenate=True)


# WGAN-GP: a gradient penalty through torch.autograd.grad(create_graph=True).


def wgan_gp(run: Run, log_penalty: bool) -> Step:
    init(run)
    generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    critic = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimize_g = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.0, 0.9))
    optimize_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    noise = seeded(run, 14)
    real = [torch.randn(16, 16, generator=noise) for _ in range(4)]
    penalties: list[torch.Tensor] = []

    def step(i: int) -> None:
        fake = generator(torch.randn(16, 8, generator=noise)).detach()
        mix = torch.rand(16, 1, generator=noise)
        between = (mix * real[i % 4] + (1 - mix) * fake).requires_grad_(True)
        (gradient,) = torch.autograd.grad(critic(between).sum(), between, create_graph=True)
        penalty = 10 * (gradient.norm(2, dim=1) - 1).pow(2).mean()
        c_loss = critic(fake).mean() - critic(real[i % 4]).mean() + penalty
        optimize_c.zero_grad()
        c_loss.backward()
        optimize_c.step()
        if log_penalty:
            penalties.append(penalty)  # logged as a tensor: keeps the double-backward graph
        if i % 2 == 1:  # the generator steps once per two critic steps
            g_loss = -critic(generator(torch.randn(16, 8, generator=noise))).mean()
            optimize_g.zero_grad()
            g_loss.backward()
            optimize_g.step()

    return step


@loop(leaks=False)
def wgan_gp_with_two_critic_steps_per_generator_step(run: Run) -> Step:
    """WGAN-GP: gradient penalty with create_graph=True, the generator updated every other step."""
    return wgan_gp(run, log_penalty=False)


@loop(leaks=True)
def wgan_gp_penalties_logged_with_their_graph(run: Run) -> Step:
    """WGAN-GP logging each step's gradient penalty as a tensor, which keeps its double-backward graph."""
    return wgan_gp(run, log_penalty=True)


# MAML: an inner loop of functional updates, differentiated through by the outer step.


def maml(run: Run, keep_adapted: bool) -> Step:
    init(run)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    meta_optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tasks = seeded(run, 15)
    adapted_history: list[list[torch.Tensor]] = []

    def forward(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, weights[0], weights[1]).relu(), weights[2], weights[3])

    def step(i: int) -> None:
        slope = torch.randn(4, 1, generator=tasks)
        support, query = torch.randn(10, 4, generator=tasks), torch.randn(10, 4, generator=tasks)
        weights = list(model.parameters())
        for _ in range(2):  # inner steps, kept differentiable for the outer update
            gradients = torch.autograd.grad(
                F.mse_loss(forward(weights, support), support @ slope), weights, create_graph=True
            )
            weights = [w - 0.01 * g for w, g in zip(weights, gradients, strict=False)]
        meta_optimizer.zero_grad()
        F.mse_loss(forward(weights, query), query @ slope).backward()
        meta_optimizer.step()
        if keep_adapted:
            adapted_history.append(weights)  # each task's adapted weights, with the inner loop's graph

    return step


@loop(leaks=False)
def maml_inner_loop_through_create_graph(run: Run) -> Step:
    """MAML: two functional inner steps with create_graph=True per task, then a meta-update."""
    return maml(run, keep_adapted=False)


@loop(leaks=True)
def maml_adapted_weights_kept_per_task(run: Run) -> Step:
    """MAML keeping each task's adapted weights, which hold the inner loop's graph and its saved tensors."""
    return maml(run, keep_adapted=True)


# REINFORCE over episodes of varying length.


def reinforce(run: Run, keep_returns: bool) -> Step:
    init(run)
    policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    environment, lengths = seeded(run, 16), sampler(run, 17)
    last: dict[str, object] = {}
    all_returns: list[torch.Tensor] = []

    def step(i: int) -> None:
        log_probs, rewards = [], []
        for _ in range(lengths.randint(5, 40)):  # the episode ends when the pole falls
            distribution = torch.distributions.Categorical(logits=policy(torch.randn(4, generator=environment)))
            action = distribution.sample()
            log_probs.append(distribution.log_prob(action))
            rewards.append(1.0)
        returns = torch.tensor(rewards).flip(0).cumsum(0).flip(0)
        baseline = torch.cat([*all_returns, returns]).mean() if keep_returns else returns.mean()
        loss = -(torch.stack(log_probs) * (returns - baseline)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last.update(log_probs=log_probs, returns=returns)  # what an inline loop holds until its next episode
        if keep_returns:
            all_returns.append(returns)  # 20 B to 160 B a step, for a baseline over every episode

    return step


@loop(leaks=False)
def reinforce_over_episodes_of_5_to_40_steps(run: Run) -> Step:
    """REINFORCE on episodes of 5 to 40 steps, the last episode's log-probabilities held until the next."""
    return reinforce(run, keep_returns=False)


@loop(leaks=True)
def reinforce_returns_of_every_episode_kept_for_a_baseline(run: Run) -> Step:
    """REINFORCE keeping every episode's returns (20 B to 160 B a step) to average a baseline over all of them."""
    return reinforce(run, keep_returns=True)


# Autoregressive decoding with a key/value cache.


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.qkv, self.out = nn.Embedding(50, 16), nn.Linear(16, 48), nn.Linear(16, 50)

    def forward(self, token: torch.Tensor, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        query, key, value = self.qkv(self.embed(token)).chunk(3, dim=-1)
        for name, new in (("keys", key), ("values", value)):
            cache[name] = torch.cat([cache[name], new]) if name in cache else new
        weights = (query @ cache["keys"].t() / 4).softmax(-1)
        return self.out(weights @ cache["values"])


def decoding(run: Run, one_cache: bool) -> Step:
    init(run)
    model = Decoder().eval()
    lengths = sampler(run, 18)
    cache: dict[str, torch.Tensor] = {}
    last: dict[str, object] = {}

    def step(i: int) -> None:
        if not one_cache:
            cache.clear()  # a new prompt: a new cache
        token = torch.tensor([i % 50])
        generated = []
        with torch.no_grad():
            for _ in range(lengths.randint(2, 12)):
                token = model(token, cache).argmax(-1)
                generated.append(token)
        last.update(tokens=torch.cat(generated), cache=dict(cache))  # held until the next prompt

    return step


@loop(leaks=False)
def kv_cache_decoding_a_new_prompt_each_step(run: Run) -> Step:
    """Greedy decoding of 2 to 12 tokens a step with a KV cache started afresh for each prompt."""
    return decoding(run, one_cache=False)


@loop(leaks=True)
def kv_cache_never_reset_between_prompts(run: Run) -> Step:
    """Greedy decoding whose KV cache is never reset: 2 to 12 tokens' keys and values (128 B each) more each step."""
    return decoding(run, one_cache=True)


# Stochastic weight averaging.


def swa(run: Run, keep_snapshots: bool) -> Step:
    model, data = mlp(run), classification_batches(run)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    averaged = torch.optim.swa_utils.AveragedModel(model)
    scheduler = torch.optim.swa_utils.SWALR(optimizer, swa_lr=0.01, anneal_epochs=2)
    snapshots: list[dict[str, torch.Tensor]] = []

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])
        if i % 2 == 1:
            averaged.update_parameters(model)
            scheduler.step()
            if keep_snapshots:
                snapshots.append({key: value.detach().clone() for key, value in model.state_dict().items()})

    return step


@loop(leaks=False)
def swa_averaging_every_other_step(run: Run) -> Step:
    """SWA: AveragedModel updated in place and SWALR stepped every other step."""
    return swa(run, keep_snapshots=False)


@loop(leaks=True)
def swa_snapshots_kept_every_other_step(run: Run) -> Step:
    """SWA that also keeps a copy of the weights (11 KiB) every other step, to average them again later."""
    return swa(run, keep_snapshots=True)


# Magnitude pruning.


def pruning(run: Run, keep_masks: bool) -> Step:
    model, data = mlp(run), classification_batches(run)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    masks: list[torch.Tensor] = []

    def step(i: int) -> None:
        train_step(model, optimizer, *data[i % len(data)])
        if i % 3 == 2:  # prune 20% of the first layer's weights, then make it permanent
            prune.l1_unstructured(model[0], "weight", amount=0.2)
            if keep_masks:
                masks.append(model[0].weight_mask.bool())
            prune.remove(model[0], "weight")
        elif keep_masks:
            masks.append(model[0].weight.detach() != 0)  # 2 KiB a step, for a sparsity animation

    return step


@loop(leaks=False)
def pruning_masks_applied_and_removed_every_third_step(run: Run) -> Step:
    """Magnitude pruning every third step with prune.l1_unstructured, made permanent with prune.remove."""
    return pruning(run, keep_masks=False)


@loop(leaks=True)
def pruning_masks_kept_every_step_for_an_animation(run: Run) -> Step:
    """Magnitude pruning every third step, and each step's sparsity mask (2 KiB) kept for an animation."""
    return pruning(run, keep_masks=True)


# Knowledge distillation.


def distillation(run: Run, cache_teacher: bool) -> Step:
    student, data = mlp(run), seeded(run, 19)
    init(run, 1)
    teacher = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES)).eval()
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    cached: dict[int, torch.Tensor] = {}
    last: dict[str, torch.Tensor] = {}

    def step(i: int) -> None:
        x = torch.randn(BATCH, FEATURES, generator=data)  # a stream: every sample is new
        ids = range(i * BATCH, (i + 1) * BATCH)
        with torch.no_grad():
            teacher_logits = teacher(x)
        if cache_teacher:  # a cache keyed by sample id, for the epochs to come that never reuse them
            cached.update(zip(ids, teacher_logits, strict=False))
        loss = F.kl_div(F.log_softmax(student(x) / 2, -1), F.softmax(teacher_logits / 2, -1), reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last.update(x=x)

    return step


@loop(leaks=False)
def distillation_from_a_teacher_under_no_grad(run: Run) -> Step:
    """Knowledge distillation: the teacher's logits under no_grad, the student fit to them at temperature 2."""
    return distillation(run, cache_teacher=False)


@loop(leaks=True)
def distillation_teacher_logits_cached_by_sample_id(run: Run) -> Step:
    """Distillation caching the teacher's logits by sample id (views of a 640 B tensor a step); ids never repeat."""
    return distillation(run, cache_teacher=True)


# Metric objects.


class ConfusionMatrix:
    """Counts in place; reset() makes a fresh matrix."""

    def __init__(self) -> None:
        self.reset()

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.counts += torch.bincount(targets * CLASSES + predictions, minlength=CLASSES * CLASSES).reshape(
            CLASSES, CLASSES
        )

    def reset(self) -> None:
        self.counts = torch.zeros(CLASSES, CLASSES, dtype=torch.long)


class AccuracyKeepingEverything:
    """A metric in the style of one that stores its inputs and computes at the end: nobody resets it."""

    def __init__(self) -> None:
        self.predictions: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.predictions.append(predictions)
        self.targets.append(targets)

    def compute(self) -> float:
        return float((torch.cat(self.predictions) == torch.cat(self.targets)).float().mean())


def metric(run: Run, keeping: bool) -> Step:
    model, data = mlp(run), classification_batches(run)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    confusion, accuracy = ConfusionMatrix(), AccuracyKeepingEverything()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        if keeping:
            accuracy.update(logits.detach().argmax(-1), y.clone())  # 256 B a step
        else:
            confusion.update(logits.detach().argmax(-1), y)
            if i % 4 == 3:  # the end of an epoch of four batches
                confusion.reset()

    return step


@loop(leaks=False)
def confusion_matrix_metric_reset_every_4_steps(run: Run) -> Step:
    """A confusion-matrix metric counting in place, reset (a fresh matrix) at the end of each 4-step epoch."""
    return metric(run, keeping=False)


@loop(leaks=True)
def accuracy_metric_storing_predictions_never_reset(run: Run) -> Step:
    """An accuracy metric that stores every batch's predictions and targets (256 B a step) and is never reset."""
    return metric(run, keeping=True)


# Hooks registered every step.


def hooks(run: Run, remove: bool) -> Step:
    model, data = mlp(run), classification_batches(run)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    drift: list[float] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        with torch.no_grad():
            anchor = model[0](x).mean(0)  # 256 B: this step's mean activation, to measure drift against

        def measure(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            drift.append(float((output.detach().mean(0) - anchor).norm()))

        handle = model[0].register_forward_hook(measure)
        train_step(model, optimizer, x, y)
        if remove:
            handle.remove()

    return step


@loop(leaks=False)
def forward_hook_registered_and_removed_each_step(run: Run) -> Step:
    """A forward hook registered at each step's start, capturing a 256 B anchor, removed at its end."""
    return hooks(run, remove=True)


@loop(leaks=True)
def forward_hook_registered_each_step_never_removed(run: Run) -> Step:
    """A forward hook registered every step and never removed: each keeps its step's 256 B anchor."""
    return hooks(run, remove=False)


# Variable-length sequences.


def packed_gru(run: Run, cache_masks: bool) -> Step:
    init(run)
    gru, head = nn.GRU(8, 16, batch_first=True), nn.Linear(16, 2)
    optimizer = torch.optim.Adam([*gru.parameters(), *head.parameters()], lr=1e-3)
    data, draw = seeded(run, 20), sampler(run, 21)
    last: dict[str, torch.Tensor] = {}
    masks: dict[int, torch.Tensor] = {}
    longest = draw.sample(range(8, 8 + 4 * run.most), run.most)  # a new longest length at each step

    def step(i: int) -> None:
        lengths = sorted((draw.randint(1, longest[i]) for _ in range(7)), reverse=True)
        lengths.insert(0, longest[i])
        x = torch.randn(8, longest[i], 8, generator=data)
        if cache_masks:  # a padding mask per longest length, cached: each length is new
            masks[longest[i]] = torch.arange(longest[i])[None, :] < torch.tensor(lengths)[:, None]
        output, hidden = gru(pack_padded_sequence(x, torch.tensor(lengths), batch_first=True))
        loss = F.cross_entropy(head(hidden[-1]), torch.randint(2, (8,), generator=data))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last.update(x=x)  # held until the next step, as a loop written inline holds it

    return step


@loop(leaks=False)
def gru_on_packed_sequences_of_new_lengths(run: Run) -> Step:
    """A GRU on packed batches of 8 sequences whose longest length is new each step (8 to 8 + 4n)."""
    return packed_gru(run, cache_masks=False)


@loop(leaks=True)
def padding_mask_cached_per_new_length(run: Run) -> Step:
    """A GRU on packed batches caching a padding mask per longest length, new each step: 8 B a position, 64 B up."""
    return packed_gru(run, cache_masks=True)


# Data-dependent routing: how many layers a batch goes through depends on the batch.


def early_exit(run: Run, keep_halting: bool) -> Step:
    init(run)
    layers, exits = (
        nn.ModuleList(nn.Linear(16, 16) for _ in range(4)),
        nn.ModuleList(nn.Linear(16, 2) for _ in range(4)),
    )
    optimizer = torch.optim.SGD([*layers.parameters(), *exits.parameters()], lr=0.05)
    data, sizes = seeded(run, 22), sampler(run, 23)
    last: dict[str, torch.Tensor] = {}
    halting: list[torch.Tensor] = []

    def step(i: int) -> None:
        x = torch.randn(sizes.randint(2, 40), 16, generator=data)
        y = torch.randint(2, (len(x),), generator=data)
        depth = sizes.randint(1, 4)  # stands in for "exit once confident enough"
        hidden, losses, confidences = x, [], []
        for layer, exit_head in zip(layers[:depth], exits[:depth], strict=False):
            hidden = layer(hidden).relu()
            logits = exit_head(hidden)
            losses.append(F.cross_entropy(logits, y))
            confidences.append(logits.detach().softmax(-1).amax(-1))
        optimizer.zero_grad(set_to_none=True)  # layers past the exit get no gradient this step
        torch.stack(losses).mean().backward()
        optimizer.step()
        last.update(x=x, hidden=hidden)
        if keep_halting:
            halting.append(torch.stack(confidences))  # 8 B to 640 B a step

    return step


@loop(leaks=False)
def early_exit_depth_chosen_per_batch(run: Run) -> Step:
    """Early exit: each batch of 2 to 40 rows leaves after 1 to 4 layers; unused layers' gradients are None."""
    return early_exit(run, keep_halting=False)


@loop(leaks=True)
def early_exit_confidences_kept_each_step(run: Run) -> Step:
    """Early exit keeping each batch's exit confidences (8 B to 640 B a step) for a calibration plot."""
    return early_exit(run, keep_halting=True)


# Periodic clearing.


def epoch_outputs(run: Run, keep_summaries: bool) -> Step:
    model, data = mlp(run), classification_batches(run)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    outputs: list[torch.Tensor] = []
    summaries: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
        outputs.append(logits.detach())
        if i % 4 == 3:  # the end of an epoch of four batches
            if keep_summaries:
                summaries.append(torch.cat(outputs).softmax(-1).mean(0))  # 40 B an epoch
            outputs.clear()
        if keep_summaries:
            summaries.append(logits.detach().amax(-1))  # and 64 B a step: the batch's top logits

    return step


@loop(leaks=False)
def epoch_outputs_cleared_every_4_steps(run: Run) -> Step:
    """Each step's logits (640 B) collected for an epoch metric and cleared every 4 steps."""
    return epoch_outputs(run, keep_summaries=False)


@loop(leaks=True)
def epoch_outputs_cleared_but_top_logits_kept(run: Run) -> Step:
    """Logits collected and cleared every 4 steps, while each batch's top logits (64 B a step) are kept."""
    return epoch_outputs(run, keep_summaries=True)


# Gradients set to None on alternate steps: accumulation over two steps.


def accumulate_over_2(run: Run, keep_losses: bool) -> Step:
    model, data = mlp(run), classification_batches(run)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[torch.Tensor] = []

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        loss = F.cross_entropy(model(x), y) / 2
        loss.backward()
        if i % 2 == 1:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if keep_losses:
            losses.append(loss.detach().reshape(1).repeat(8))  # 32 B a step

    return step


@loop(leaks=False)
def gradients_accumulated_over_2_steps_then_set_to_none(run: Run) -> Step:
    """Gradients accumulated over two steps, then the update and zero_grad(set_to_none=True): they exist every other step."""
    return accumulate_over_2(run, keep_losses=False)


@loop(leaks=True)
def accumulation_over_2_steps_keeping_32_bytes_a_step(run: Run) -> Step:
    """Gradients accumulated over two steps and set to None, while each step keeps 32 B of its loss."""
    return accumulate_over_2(run, keep_losses=True)


# Variable batches through a mixture of experts (data-dependent routing), with a capacity-limited log.


def routed(run: Run, keep_overflow: bool) -> Step:
    init(run)
    experts, router = nn.ModuleList(nn.Linear(16, 16) for _ in range(4)), nn.Linear(16, 4)
    optimizer = torch.optim.Adam([*experts.parameters(), *router.parameters()], lr=1e-3)
    data, sizes = seeded(run, 24), sampler(run, 25)
    last: dict[str, torch.Tensor] = {}
    overflow: list[torch.Tensor] = []

    def step(i: int) -> None:
        x = torch.randn(sizes.randint(4, 48), 16, generator=data)
        scores = router(x).softmax(-1)
        choice = scores.argmax(-1)
        out = torch.zeros_like(x)
        for index, expert in enumerate(experts):
            chosen = (choice == index).nonzero().squeeze(1)[:8]  # each expert takes at most 8 rows
            if len(chosen):
                out[chosen] = expert(x[chosen]) * scores[chosen, index, None]
        loss = F.mse_loss(out, x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last.update(x=x, out=out)
        if keep_overflow:  # the busiest expert's rows, kept to study the routing: at least a row a step
            busiest = torch.bincount(choice, minlength=4).argmax()
            overflow.append(x[choice == busiest].clone())

    return step


@loop(leaks=False)
def experts_with_capacity_on_batches_of_4_to_48_rows(run: Run) -> Step:
    """Top-1 routing over 4 experts of capacity 8, batches of 4 to 48 rows, idle experts' gradients None."""
    return routed(run, keep_overflow=False)


@loop(leaks=True)
def experts_keeping_the_busiest_experts_rows(run: Run) -> Step:
    """Top-1 routing over 4 experts, keeping the busiest expert's rows (64 B to 3 KiB a step) for a study."""
    return routed(run, keep_overflow=True)


# Large feature maps.


def feature_maps(run: Run, keep_maps: bool) -> Step:
    init(run)
    encoder = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    head = nn.Linear(8, CLASSES)
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.01)
    data = seeded(run, 26)
    images = [torch.randn(8, 3, 64, 64, generator=data) for _ in range(2)]
    labels = [torch.randint(CLASSES, (8,), generator=data) for _ in range(2)]
    kept: list[torch.Tensor] = []
    activation_means: list[float] = []

    def step(i: int) -> None:
        maps = encoder(images[i % 2])  # 8 x 8 x 64 x 64 floats: 1 MiB
        loss = F.cross_entropy(head(maps.mean(dim=(2, 3))), labels[i % 2])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if keep_maps:
            kept.append(maps.detach())
        else:
            activation_means.append(maps.detach().mean().item())

    return step


@loop(leaks=False)
def cnn_feature_maps_summarised_as_floats(run: Run) -> Step:
    """A CNN's 1 MiB feature maps summarised each step as a Python float for a dashboard."""
    return feature_maps(run, keep_maps=False)


@loop(leaks=True)
def cnn_feature_maps_kept_for_a_visualisation(run: Run) -> Step:
    """A CNN whose 1 MiB feature maps are kept every step for a visualisation at the end of the run."""
    return feature_maps(run, keep_maps=True)


def test_catalogue_is_balanced() -> None:
    names = CATALOGUE.ids()
    assert len(names) == len(set(names)) >= 30
    assert sum(entry.leaks for entry in CATALOGUE) * 2 == len(CATALOGUE), "half the loops should leak"


@pytest.mark.parametrize("setting", SETTING_PARAMS)
@pytest.mark.parametrize("entry", CATALOGUE, ids=CATALOGUE.ids())
def test_no_seed_gets_a_wrong_verdict(entry: Loop, setting: Setting) -> None:
    check_catalogue_entry(entry, setting)
