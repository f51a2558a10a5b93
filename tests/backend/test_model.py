"""The paged Llama forward equals a dense causal forward; per-rank shapes; k of L layers."""

from __future__ import annotations

import pytest
import torch

import backend.model as model_module
from backend.model import PagedLlama, StepBatch, PrefillSpan, rank_shape
from simulator.errors import KvplanError
from simulator.kv.models import get_model

TINY = get_model("tiny")
BLOCK_SIZE = 4
REL_TOL = 1e-4


def make_model(num_layers: int | None = None) -> PagedLlama:
    return PagedLlama(TINY, num_blocks=16, block_size=BLOCK_SIZE, max_model_len=64, num_layers=num_layers,
                      seed=3)


def slots(table: list[int], start: int, count: int) -> list[int]:
    return [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, start + count)]


def step(prefills: list[tuple[list[int], int, list[int]]],
         decodes: list[tuple[int, int, list[int]]]) -> StepBatch:
    """A step batch from prefill chunks (tokens, first position, table) then decodes (token,
    position, table); every chunk samples its last row, every decode samples."""
    ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    spans: list[PrefillSpan] = []
    samples: list[int] = []
    for tokens, start, table in prefills:
        spans.append(PrefillSpan(len(ids), len(tokens), start, start + len(tokens),
                                 torch.tensor(table, dtype=torch.int32)))
        ids += tokens
        positions += range(start, start + len(tokens))
        slot_mapping += slots(table, start, len(tokens))
        samples.append(len(ids) - 1)
    num_prefill = len(ids)
    width = max((len(t) for _, _, t in decodes), default=1)
    tables = torch.zeros((len(decodes), width), dtype=torch.int32)
    for i, (token, pos, table) in enumerate(decodes):
        tables[i, :len(table)] = torch.tensor(table)
        samples.append(len(ids))
        ids.append(token)
        positions.append(pos)
        slot_mapping += slots(table, pos, 1)
    return StepBatch(
        torch.tensor(ids), torch.tensor(positions), torch.tensor(slot_mapping), tuple(spans), num_prefill,
        tables, torch.tensor([pos + 1 for _, pos, _ in decodes], dtype=torch.int32), torch.tensor(samples),
    )


def assert_close(paged: torch.Tensor, dense: torch.Tensor) -> None:
    err = (paged - dense).abs().max() / dense.abs().max()
    assert err < REL_TOL, f"relative error {err:.2e}"


def dense_last(model: PagedLlama, tokens: list[int]) -> torch.Tensor:
    return model.reference_logits(torch.tensor(tokens))[-1]


def test_paged_steps_match_dense_forward_with_chunks_fork_and_cow() -> None:
    model = make_model()
    gen = torch.Generator().manual_seed(0)
    seq_a = torch.randint(0, TINY.vocab_size, (13,), generator=gen).tolist()
    seq_b = seq_a[:10] + torch.randint(0, TINY.vocab_size, (3,), generator=gen).tolist()
    table_a = [9, 2, 14]  # scattered; 10 prompt tokens leave block 14 half full

    model.forward(step([(seq_a[:6], 0, table_a)], []))  # chunk 1: no sampled row needed
    logits = model.forward(step([(seq_a[6:10], 6, table_a)], []))  # chunk 2 emits the first token
    assert_close(logits[0], dense_last(model, seq_a[:10]))

    # fork: B shares A's blocks; its first write lands in the shared, partial block 14 -> COW to 5
    table_b = [9, 2, 5]
    model.copy_blocks(torch.tensor([14]), torch.tensor([5]))
    logits = model.forward(step([], [(seq_a[10], 10, table_a), (seq_b[10], 10, table_b)]))
    assert_close(logits[0], dense_last(model, seq_a[:11]))
    assert_close(logits[1], dense_last(model, seq_b[:11]))

    # a mixed step: a new prompt C prefills while A and B decode
    seq_c = torch.randint(0, TINY.vocab_size, (5,), generator=gen).tolist()
    logits = model.forward(step([(seq_c, 0, [7, 0])], [(seq_a[11], 11, table_a), (seq_b[11], 11, table_b)]))
    assert_close(logits[0], dense_last(model, seq_c))
    assert_close(logits[1], dense_last(model, seq_a[:12]))
    assert_close(logits[2], dense_last(model, seq_b[:12]))

    # both cross into a new block (grow before write)
    table_a, table_b = table_a + [11], table_b + [3]
    logits = model.forward(step([], [(seq_a[12], 12, table_a), (seq_b[12], 12, table_b)]))
    assert_close(logits[0], dense_last(model, seq_a))
    assert_close(logits[1], dense_last(model, seq_b))


def test_prompts_sharing_a_block_written_in_the_same_step() -> None:
    """D's cached prefix block is written by C's chunk in this very step: every row's K/V is
    written before any attention reads the pool."""
    model = make_model()
    gen = torch.Generator().manual_seed(1)
    seq_c = torch.randint(0, TINY.vocab_size, (7,), generator=gen).tolist()
    seq_d = seq_c[:4] + torch.randint(0, TINY.vocab_size, (3,), generator=gen).tolist()
    logits = model.forward(step([(seq_c, 0, [6, 1]), (seq_d[4:], 4, [6, 12])], []))
    assert_close(logits[0], dense_last(model, seq_c))
    assert_close(logits[1], dense_last(model, seq_d))


@pytest.mark.parametrize("num_layers", [1, 2])
def test_running_k_layers_runs_k(num_layers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(num_layers)
    calls: list[int] = []
    real_write = model_module.write_kv

    def counting_write(*args: object, **kwargs: object) -> None:
        calls.append(1)
        real_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(model_module, "write_kv", counting_write)
    model.forward(step([([1, 2, 3], 0, [0])], []))
    assert len(calls) == num_layers
    assert len(model.layers) == num_layers and model.kv_pool.shape[0] == num_layers
    assert model.shape.num_total_layers == TINY.num_hidden_layers


def test_rank_shape_of_tensor_parallel_ranks() -> None:
    llama = get_model("llama-3.1-8b")
    tp2 = rank_shape(llama, tp=2)
    assert (tp2.num_q_heads, tp2.num_kv_heads, tp2.intermediate_size, tp2.vocab_size) == (16, 4, 7168, 64128)
    tp16 = rank_shape(llama, tp=16)  # more ranks than KV heads: one (replicated) KV head each
    assert (tp16.num_q_heads, tp16.num_kv_heads) == (2, 1)
    assert rank_shape(llama, num_layers=4).num_layers == 4


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("deepseek-v3", {}, "DeepSeek-V3 uses MLA"),
    ("llama-3.1-8b", {"tp": 3}, "--tp 3 does not divide"),
    ("llama-3.1-8b", {"num_layers": 33}, "--layers must be in 1..32"),
    ("llama-3.1-8b", {"num_layers": 0}, "--layers must be in 1..32"),
])
def test_rank_shape_refuses_bad_input(name: str, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(KvplanError, match=message):
        rank_shape(get_model(name), **kwargs)


def test_opt_runs_with_its_two_matrix_mlp() -> None:
    shape = rank_shape(get_model("opt-13b"), tp=8)
    assert not shape.gated_mlp and shape.num_kv_heads == 5
