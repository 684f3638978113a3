"""GRPO's padding-free feeding (dsh.training.rollout): a rollout round split into steps of similar length without
losing or duplicating a row, and packed log-probabilities equal to TRL's padded ones."""

import pytest
import torch

from dsh.training.rollout import length_sorted_steps


def _round(lengths, width=12, prompt=3):
    n = len(lengths)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, c in enumerate(lengths):
        mask[i, :c] = 1
    ids = torch.arange(n * width).view(n, width) * mask
    return {"prompt_ids": torch.arange(n * prompt).view(n, prompt), "prompt_mask": torch.ones(n, prompt, dtype=torch.long),
            "completion_ids": ids, "completion_mask": mask, "advantages": torch.arange(n, dtype=torch.float),
            "old_per_token_logps": ids.float() / 7, "num_items_in_batch": torch.tensor(int(mask.sum())),
            "names": [f"r{i}" for i in range(n)]}


def test_length_sorted_steps_keep_every_row_once_and_drop_only_padding():
    lengths = [5, 1, 12, 3, 7, 2, 9, 4]
    batch = _round(lengths)
    steps = length_sorted_steps(batch, 4, torch.Generator().manual_seed(0))
    assert len(steps) == 4
    seen = sorted(int(a) for s in steps for a in s["advantages"])
    assert seen == list(range(8))                                        # every row once
    for s in steps:
        rows = [int(a) for a in s["advantages"]]
        w = max(lengths[r] for r in rows)
        assert s["completion_ids"].shape == (2, w) and s["old_per_token_logps"].shape == (2, w)
        assert s["prompt_ids"].shape == (2, 3)                           # prompts untouched
        for k, r in enumerate(rows):                                     # the same row, all its tokens
            assert torch.equal(s["completion_ids"][k], batch["completion_ids"][r, :w])
            assert s["completion_mask"][k].sum() == lengths[r] and s["names"][k] == f"r{r}"
        assert s["num_items_in_batch"] == batch["num_items_in_batch"]     # the round's token count: dapo's weights
    widths = sorted(s["completion_ids"].shape[1] for s in steps)
    assert widths == [2, 4, 7, 12]                                       # similar lengths together
    again = length_sorted_steps(batch, 4, torch.Generator().manual_seed(0))
    assert [s["names"] for s in again] == [s["names"] for s in steps]    # the order follows the seed
    with pytest.raises(ValueError, match="does not split into 3 equal steps"):
        length_sorted_steps(batch, 3, torch.Generator())


@pytest.mark.slow
def test_packed_logps_equal_trls_padded_ones(tmp_path):
    """TRL's GRPOTrainer on the shipped base: the log-probabilities and entropies of completions of unequal length
    from the packed path equal those of TRL's padded path (the values TRL trains on), and their gradients too."""
    from datasets import Dataset
    from trl import GRPOConfig

    from dsh.llm import models
    from dsh.llm.packing import register
    from dsh.training.grpo_trainer import EngineGRPOTrainer
    from dsh.training.laptop_base import SHIPPED_BASE
    from dsh.training.train import task_reward

    model, tok = models.load(str(SHIPPED_BASE))
    model.set_attn_implementation(register())
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, use_cpu=True,
                      bf16=False, report_to=[], max_completion_length=32, beta=0.0)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "Calculate 7 * 23. Think step by step."}],
                             "answer": "161"}] * 4)
    trainer = EngineGRPOTrainer(model=model, reward_funcs=[task_reward("laptop_task")], args=args, train_dataset=ds,
                                   processing_class=tok)
    torch.manual_seed(0)
    prompt = torch.tensor([[0, 0, 5, 6, 7], [0, 8, 9, 10, 11], [12, 13, 14, 15, 16], [0, 0, 0, 17, 18]])
    pmask = (prompt != 0).long()
    comp = torch.randint(3, 60, (4, 9))
    cmask = torch.tensor([[1] * 9, [1] * 3 + [0] * 6, [1] * 6 + [0] * 3, [1] + [0] * 8])
    ids, mask = torch.cat([prompt, comp * cmask], 1), torch.cat([pmask, cmask], 1)
    out = {}
    for packed in (False, True):
        trainer.padding_free = packed
        model.zero_grad()
        lp, ent, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 9, batch_size=3, compute_entropy=True)
        (lp * cmask).sum().backward()
        out[packed] = (lp.detach() * cmask, ent.detach() * cmask, model.model.layers[0].mlp.up_proj.weight.grad.clone())
    for a, b in zip(out[False], out[True]):
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    assert out[True][0].abs().sum() > 0
