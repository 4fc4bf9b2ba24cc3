from __future__ import annotations

import torch

from prudent.preflight import structure


def test_signature_walks_nested_batches_in_order() -> None:
    batch = {"x": torch.zeros(4, 3), "y": [torch.zeros(4, dtype=torch.long), "tag"]}
    assert structure.signature(batch) == [
        ("batch['x']", (4, 3), "float32"), ("batch['y'][0]", (4,), "int64"),
        ("batch['y'][1]", None, "str")]


def test_compare_ignores_the_batch_dimension_but_not_dtypes_or_keys() -> None:
    first = structure.signature((torch.zeros(32, 64), torch.zeros(32, dtype=torch.long)))
    smaller = structure.signature((torch.zeros(29, 64), torch.zeros(29, dtype=torch.long)))
    double = structure.signature((torch.zeros(32, 64, dtype=torch.float64),
                                  torch.zeros(32, dtype=torch.long)))
    assert structure.compare(first, smaller) == []
    assert structure.compare(first, double) == ["batch[0] is float64, was float32"]
    assert structure.compare(first, first[:1]) == ["batch[1] is missing"]
    assert structure.batch_size(smaller) == 29


def test_nonfinite_samples_names_the_rows() -> None:
    x = torch.zeros(8, 3)
    x[5, 1] = float("nan")
    x[6, 0] = float("inf")
    found = structure.nonfinite_samples((x, torch.zeros(8, dtype=torch.long)))
    assert found == [{"path": "batch[0]", "rows": [5, 6]}]
    assert structure.nonfinite_samples(torch.ones(2)) == []
