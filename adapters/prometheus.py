"""Read a backend's Prometheus text into the common metric names of its adapter's `metric_names` map, and the
settings an `*_info` gauge carries in its labels (its adapter's `info_metrics` map)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families


def common_metrics(text: str, metric_names: Mapping[str, str]) -> dict[str, float]:
    """Sum each mapped metric over its label sets. Counters and gauges map by sample name (`x_total`);
    histograms and summaries give `<common>_sum` and `<common>_count`."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            common = metric_names.get(name)
            if common is None:
                for suffix in ("_sum", "_count"):
                    base = name.removesuffix(suffix)
                    if base != name and base in metric_names:
                        common = metric_names[base] + suffix
                        break
            if common is None and family.type == "counter":
                # the parser reports a counter family without `_total`; maps may use either spelling
                common = metric_names.get(family.name) if name == family.name + "_total" else None
            if common is not None:
                out[common] = out.get(common, 0.0) + float(sample.value)
    return out


def info_settings(text: str, info_metrics: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The labels of each mapped info gauge (`vllm:cache_config_info{block_size="16",...} 1.0`) under their
    common setting names, as written; a label of "None" says nothing and is left out. With several engines
    (data parallel) the first sample's labels are read."""
    out: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = info_metrics.get(sample.name) or info_metrics.get(family.name)
            if labels is None:
                continue
            for label, common in labels.items():
                value = sample.labels.get(label)
                if value not in (None, "", "None") and common not in out:
                    out[common] = value
    return out
