"""ops.Dropout and ops.label_smoothed_cross_entropy against PyTorch's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer.ops import Dropout, label_smoothed_cross_entropy


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_drops_a_fraction_p_and_keeps_the_mean(p):
    torch.manual_seed(0)
    X = torch.rand(400, 500) + 0.5
    Y = Dropout(p).train()(X)
    dropped = (Y == 0).float().mean().item()
    assert abs(dropped - round(p * 256) / 256) < 0.005
    kept = Y != 0
    torch.testing.assert_close(Y[kept], X[kept] / (1 - round(p * 256) / 256))
    assert abs(Y.mean().item() / X.mean().item() - 1) < 0.01


def test_dropout_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(0)
    X = torch.randn(64, 32, requires_grad=True)
    Y = Dropout(0.3).train()(X)
    Y.sum().backward()
    scale = 256 / (256 - round(0.3 * 256))
    torch.testing.assert_close(X.grad, (Y != 0).float() * scale)


def test_dropout_is_seeded_and_off_in_eval_and_for_p0():
    X = torch.randn(8, 16)
    d = Dropout(0.3).train()
    torch.manual_seed(1)
    a = d(X)
    torch.manual_seed(1)
    b = d(X)
    assert torch.equal(a, b) and not torch.equal(a, d(X))
    assert torch.equal(d.eval()(X), X)
    assert torch.equal(Dropout(0.0).train()(X), X)
    assert torch.equal(Dropout(1.0).train()(X), torch.zeros_like(X))  # nn.Dropout's own


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_equals_cross_entropy_loss(epsilon):
    torch.manual_seed(0)
    logits = (3 * torch.randn(50, 40)).requires_grad_()
    target = torch.randint(0, 40, (50,))
    ref_logits = logits.detach().clone().requires_grad_()
    ours = label_smoothed_cross_entropy(logits, target, epsilon)
    ref = nn.CrossEntropyLoss(reduction="sum", label_smoothing=epsilon)(ref_logits, target)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    (2 * ours).backward()
    (2 * ref).backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-5)


def test_label_smoothed_loss_computes_in_float32_and_checks_shapes():
    logits = torch.randn(6, 10, dtype=torch.bfloat16)
    target = torch.randint(0, 10, (6,))
    loss = label_smoothed_cross_entropy(logits, target, 0.1)
    assert loss.dtype == torch.float32
    ref = nn.functional.cross_entropy(logits.float(), target, reduction="sum", label_smoothing=0.1)
    torch.testing.assert_close(loss, ref)
    with pytest.raises(ValueError, match=r"expected logits \(N, V\)"):
        label_smoothed_cross_entropy(torch.randn(2, 3, 10), target, 0.1)
