"""Plug-in metrics that break the metric contract, one way each (`-m contract_metrics:FewerRows`), for
tests/test_metric_contract.py and scripts/attack.py. Each scores the captions of a batch correctly
(`words`: the caption's word count, over 10) until a caption holds the word "break"; from that batch
on it breaks its contract in its own way, so a run's earlier batches show what a broken metric must
not cost."""

from __future__ import annotations

from caprecon.metrics.base import Column, Metric


class Words(Metric):
    """A metric that keeps its contract: the caption's words over 10."""

    name = "words"
    needs_source_image = False
    columns = (Column("words", low=0.0, high=10.0),)

    def score(self, items, ctx):
        return [{self.name: len(item.caption.split()) / 10} for item in items]


class Contract(Metric):
    """The words of each caption over 10, declared in [0, 1]; `broken` says what a breaking batch returns."""

    name = "contract"
    primary = "contract"  # the headline column, whatever the subclass is called
    needs_source_image = False
    columns = (Column("contract", low=0.0, high=1.0),)

    def score(self, items, ctx):
        rows = [{"contract": min(1.0, len(item.caption.split()) / 10)} for item in items]
        return self.broken(rows) if any("break" in item.caption for item in items) else rows

    def broken(self, rows):
        return rows


class FewerRows(Contract):
    name = "fewer-rows"

    def broken(self, rows):
        return rows[:-1]


class NoRows(Contract):
    name = "no-rows"

    def broken(self, rows):
        return []


class ExtraRows(Contract):
    name = "extra-rows"

    def broken(self, rows):
        return [*rows, {"contract": 0.5}]


class MissingColumn(Contract):
    name = "missing-column"

    def broken(self, rows):
        return [{"words": row["contract"]} for row in rows]


class TextValue(Contract):
    name = "text-value"

    def broken(self, rows):
        return [{"contract": "high"} for _ in rows]


class OutOfRange(Contract):
    name = "out-of-range"

    def broken(self, rows):
        return [{"contract": 1.5} for _ in rows]


class NotADict(Contract):
    name = "not-a-dict"

    def broken(self, rows):
        return [row["contract"] for row in rows]


class BadDirection(Contract):
    name = "bad-direction"

    columns = (Column("contract", higher_is_better="up", low=0.0, high=1.0),)


class LowAboveHigh(Contract):
    name = "low-above-high"

    columns = (Column("contract", low=1.0, high=0.0),)
