"""Request mixes: length specs, seeded draws, traces and arrivals, each checked against a hand-made expectation."""

import hashlib
import itertools
import json
import math
import re

import pytest

from kvsweep.workload.mix_sources import (
    FixedLengths,
    LengthSpec,
    LognormalLengths,
    UniformLengths,
    lengths_mix,
    parse_length_spec,
    poisson_arrivals,
    trace_mix,
)
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError


def spec(inputs: str, outputs: str) -> LengthSpec:
    return LengthSpec(parse_length_spec(inputs, "workload.input"), parse_length_spec(outputs, "workload.output"))


def nearest_rank(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[math.ceil(share * len(ordered)) - 1]


def test_length_specs_parse_each_syntax():
    assert parse_length_spec("fixed:128,512,2048", "k") == FixedLengths((128, 512, 2048))
    assert parse_length_spec(" 64 , 96 ", "k") == FixedLengths((64, 96))  # a bare list is fixed
    assert parse_length_spec("uniform:64-512", "k") == UniformLengths(64, 512)
    assert parse_length_spec("LogNormal: p99=2048, median=256", "k") == LognormalLengths(256, 2048)
    assert str(parse_length_spec("lognormal:median=256,p99=2048", "k")) == "lognormal:median=256,p99=2048"


@pytest.mark.parametrize(
    "text",
    [
        "gamma:2",
        "uniform:512-64",
        "uniform:64",
        "fixed:12,x",
        "fixed:0",
        "fixed:",
        "lognormal:median=256",
        "lognormal:median=2048,p99=256",
        "lognormal:median=0.5,p99=4",
        "lognormal:mean=3,p99=9",
        "lognormal:median=nan,p99=9",
    ],
)
def test_a_bad_length_spec_is_one_line_naming_the_key_and_text(text):
    with pytest.raises(WorkloadError) as caught:
        parse_length_spec(text, "workload.input_lengths")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"workload.input_lengths {text!r}: ")


def test_a_fixed_list_cycles_over_the_requests():
    mix = lengths_mix(spec("fixed:128,512,2048", "fixed:16,32"), requests=7, seed=0, max_positions=None)
    assert [r.input_tokens for r in mix.requests] == [128, 512, 2048, 128, 512, 2048, 128]
    assert [r.output_tokens for r in mix.requests] == [16, 32, 16, 32, 16, 32, 16]
    assert all(r.arrival_s is None for r in mix.requests)


def test_uniform_lengths_cover_the_range_evenly():
    mix = lengths_mix(spec("uniform:1-4", "fixed:1"), requests=4000, seed=3, max_positions=None)
    counts = [sum(r.input_tokens == v for r in mix.requests) for v in (1, 2, 3, 4)]
    # Each count is Binomial(4000, 1/4): mean 1000, sd sqrt(4000 * 0.25 * 0.75) ~ 27; 150 is over 5 sd.
    assert all(abs(c - 1000) < 150 for c in counts), counts
    assert sum(counts) == 4000


def test_lognormal_draws_have_the_asked_median_and_p99():
    mix = lengths_mix(spec("lognormal:median=256,p99=2048", "fixed:1"), requests=20_000, seed=11, max_positions=None)
    inputs = [r.input_tokens for r in mix.requests]
    # sigma = ln(8) / 2.326 = 0.894. The sample median's relative sd is ~0.8% at n = 20,000, the p99's ~2.4%.
    assert abs(nearest_rank(inputs, 0.5) / 256 - 1) < 0.03
    assert abs(nearest_rank(inputs, 0.99) / 2048 - 1) < 0.07
    assert min(inputs) >= 1


def test_the_same_seed_gives_the_same_mix_and_another_seed_another():
    lengths = spec("lognormal:median=300,p99=3000", "uniform:10-200")
    first, again = (lengths_mix(lengths, 50, seed=7, max_positions=4096) for _ in range(2))
    other = lengths_mix(lengths, 50, seed=8, max_positions=4096)
    assert first == again and first.sha256 == again.sha256
    assert other.sha256 != first.sha256


def test_the_fingerprint_is_the_canonical_json_of_the_requests_not_the_name():
    requests = (Request(5, 2), Request(7, 1, 0.5))
    canonical = (
        '[{"arrival_s":null,"input_tokens":5,"output_tokens":2},{"arrival_s":0.5,"input_tokens":7,"output_tokens":1}]'
    )
    expected = hashlib.sha256(canonical.encode()).hexdigest()
    assert RequestMix("a", requests).sha256 == expected == RequestMix("b", requests).sha256
    assert RequestMix("a", requests[::-1]).sha256 != expected  # the order is part of the mix


def test_clipping_keeps_every_request_within_the_positions():
    mix = lengths_mix(spec("lognormal:median=400,p99=4000", "fixed:100"), requests=500, seed=1, max_positions=600)
    assert all(r.total_tokens <= 600 and r.input_tokens >= 1 for r in mix.requests)
    assert all(r.output_tokens == 100 for r in mix.requests)  # the output is kept, the prompt gives way
    assert any(r.input_tokens == 500 for r in mix.requests)  # some were clipped: P(draw > 500) is well over 1/500
    tight = lengths_mix(spec("fixed:50", "fixed:599"), requests=1, seed=0, max_positions=600)
    assert tight.requests == (Request(1, 599),)


def test_an_output_that_fills_the_positions_is_an_error():
    with pytest.raises(WorkloadError, match="no room for a prompt in the model's 600 positions"):
        lengths_mix(spec("fixed:50", "fixed:600"), requests=1, seed=0, max_positions=600)


def test_a_mix_reports_its_shape():
    mix = RequestMix("hand", (Request(100, 20), Request(300, 5), Request(100, 400)))
    assert mix.longest_input == 300
    assert mix.longest_total == 500  # 100 + 400
    assert mix.input_lengths == (100, 300)
    assert mix.total_output_tokens == 425  # 20 + 5 + 400
    assert len(mix) == 3


def test_requests_and_mixes_refuse_impossible_values():
    with pytest.raises(WorkloadError):
        Request(0, 5)
    with pytest.raises(WorkloadError):
        Request(5, 2.0)
    with pytest.raises(WorkloadError):
        Request(5, 2, -1.0)
    with pytest.raises(WorkloadError, match="no requests"):
        RequestMix("empty", ())
    with pytest.raises(WorkloadError, match=r"workload\.requests"):
        lengths_mix(spec("fixed:5", "fixed:5"), requests=0, seed=0, max_positions=None)
    assert str(WorkloadError("one\ntwo")) == "one two"


def write_trace(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_trace_is_read_in_order_with_arrivals_made_relative(tmp_path):
    path = write_trace(
        tmp_path,
        [
            '{"input_tokens": 10, "output_tokens": 3, "arrival_s": 100.5}',
            "",
            '{"output_tokens": 4, "input_tokens": 20, "arrival_s": 101.0}',
            '{"input_tokens": 30, "output_tokens": 5, "arrival_s": 103.25}',
        ],
    )
    mix = trace_mix(path, requests=None, max_positions=None)
    assert mix.requests == (Request(10, 3, 0.0), Request(20, 4, 0.5), Request(30, 5, 2.75))
    assert trace_mix(path, requests=2, max_positions=None).requests == mix.requests[:2]
    assert len(trace_mix(path, requests=10, max_positions=None)) == 3  # fewer in the file: all of them


def test_a_trace_without_arrivals_has_none(tmp_path):
    path = write_trace(tmp_path, ['{"input_tokens": 1, "output_tokens": 1}', '{"input_tokens": 2, "output_tokens": 9}'])
    assert trace_mix(path, None, max_positions=11).requests == (Request(1, 1), Request(2, 9))  # 2 + 9 fits 11


def test_lines_after_the_requests_taken_are_not_read(tmp_path):
    path = write_trace(tmp_path, ['{"input_tokens": 1, "output_tokens": 1}', "not json"])
    assert len(trace_mix(path, requests=1, max_positions=None)) == 1


GOOD = '{"input_tokens": 10, "output_tokens": 3, "arrival_s": 5.0}'


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ('{"input_tokens": 10, "output_tokens": 3', "not JSON"),
        ("[10, 3]", "not a JSON object"),
        ('{"output_tokens": 3, "arrival_s": 6}', "no input_tokens"),
        ('{"input_tokens": 3, "arrival_s": 6}', "no output_tokens"),
        ('{"input_tokens": 2.5, "output_tokens": 3, "arrival_s": 6}', "input_tokens must be a positive integer"),
        ('{"input_tokens": "12", "output_tokens": 3, "arrival_s": 6}', "input_tokens must be a positive integer"),
        ('{"input_tokens": 12, "output_tokens": true, "arrival_s": 6}', "output_tokens must be a positive integer"),
        ('{"input_tokens": 12, "output_tokens": 0, "arrival_s": 6}', "output_tokens must be a positive integer"),
        ('{"input_tokens": -4, "output_tokens": 3, "arrival_s": 6}', "input_tokens must be a positive integer"),
        ('{"input_tokens": 4000, "output_tokens": 100, "arrival_s": 6}', "beyond the model's 4096 positions"),
        ('{"input_tokens": 12, "output_tokens": 3, "arrival_s": 4.0}', "before the previous request's 5.0"),
        ('{"input_tokens": 12, "output_tokens": 3, "arrival_s": "6"}', "arrival_s must be a number"),
        ('{"input_tokens": 12, "output_tokens": 3}', "arrival_s must be on every line or on none"),
    ],
)
def test_each_bad_trace_line_is_one_line_naming_the_path_and_line(tmp_path, bad, says):
    path = write_trace(tmp_path, [GOOD, "", bad])  # the bad line is line 3: the blank line 2 still counts
    with pytest.raises(WorkloadError) as caught:
        trace_mix(path, requests=None, max_positions=4096)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"workload.path {path} line 3: ")
    assert says in message


def test_a_negative_first_arrival_is_named(tmp_path):
    path = write_trace(tmp_path, ['{"input_tokens": 1, "output_tokens": 1, "arrival_s": -2}'])
    with pytest.raises(WorkloadError, match=r"line 1: arrival_s must not be negative"):
        trace_mix(path, None, None)


def test_an_unreadable_or_empty_trace_names_the_path(tmp_path):
    missing = str(tmp_path / "absent.jsonl")
    with pytest.raises(WorkloadError, match=re.escape(f"workload.path {missing}: cannot read it")):
        trace_mix(missing, None, None)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WorkloadError, match="cannot read it"):
        trace_mix(str(binary), None, None)
    empty = write_trace(tmp_path, ["", "  "])
    with pytest.raises(WorkloadError, match="no requests in it"):
        trace_mix(empty, None, None)


def test_poisson_arrivals_start_at_zero_and_average_one_over_the_rate():
    base = lengths_mix(spec("fixed:10,20", "fixed:5"), requests=20_000, seed=0, max_positions=None)
    timed = poisson_arrivals(base, rate_per_s=4.0, seed=5)
    arrivals = [r.arrival_s for r in timed.requests]
    assert arrivals[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(arrivals))
    # 19,999 exponential gaps of mean 1/4 s: their mean's relative sd is 1/sqrt(19,999) ~ 0.7%; allow 3%.
    assert abs(arrivals[-1] / 19_999 / 0.25 - 1) < 0.03
    # Evenly spaced arrivals have that mean too: the gaps must also spread as an exponential's do. Its standard
    # deviation equals its mean (coefficient of variation 1; the sample's sd about 1%, allow 5%)...
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    mean = sum(gaps) / len(gaps)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1))
    assert abs(sd / mean - 1) < 0.05
    # ...and their distribution is the exponential's, 1 - exp(-4x): the Kolmogorov-Smirnov distance of 19,999
    # draws stays under 1.63 / sqrt(n) ~ 0.0115 with 99% probability (evenly spaced gaps: 1 - 1/e ~ 0.63)
    ordered = sorted(gaps)
    n = len(ordered)
    distance = max(
        max((i + 1) / n - (1 - math.exp(-4 * g)), (1 - math.exp(-4 * g)) - i / n) for i, g in enumerate(ordered)
    )
    assert distance < 1.63 / math.sqrt(n)
    assert [(r.input_tokens, r.output_tokens) for r in timed.requests] == [
        (r.input_tokens, r.output_tokens) for r in base.requests
    ]
    assert poisson_arrivals(base, 4.0, seed=5).sha256 == timed.sha256
    assert poisson_arrivals(base, 4.0, seed=6).sha256 != timed.sha256
    with pytest.raises(WorkloadError, match=r"workload\.rate"):
        poisson_arrivals(base, 0.0, seed=5)


def test_the_trace_fingerprint_survives_reformatting(tmp_path):
    rows = [
        {"input_tokens": 8, "output_tokens": 2, "arrival_s": 1.0},
        {"input_tokens": 9, "output_tokens": 4, "arrival_s": 3.0},
    ]
    compact = write_trace(tmp_path, [json.dumps(r, separators=(",", ":")) for r in rows])
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text("\n\n".join(json.dumps(dict(reversed(r.items())), indent=None) for r in rows))
    assert trace_mix(compact, None, None).sha256 == trace_mix(str(spaced), None, None).sha256
