"""Demo GPU prices, so that the usage report shows costs: one per GPU model the demo's
clusters have, at a typical cloud list price per GPU-hour (an admin changes them on the
prices page). Existing prices are left as they are."""

from __future__ import annotations

from decimal import Decimal
from typing import TextIO

from clusters.metrics.models import GpuPrice
from clusters.models import Gpu

# Matched against the model name in this order; anything else gets the last one.
LIST_PRICES = (("H200", "4.50"), ("H100", "3.90"), ("A100", "2.40"), ("", "1.20"))


def seed(stdout: TextIO) -> None:
    models = sorted(set(Gpu.objects.exclude(model="").values_list("model", flat=True)))
    for model in models:
        price = next(p for key, p in LIST_PRICES if key in model.upper())
        _, made = GpuPrice.objects.get_or_create(
            gpu_model=model, defaults={"price_per_hour": Decimal(price), "currency": "USD"}
        )
        if made:
            stdout.write(f"  price of {model}: {price} USD per GPU-hour\n")
