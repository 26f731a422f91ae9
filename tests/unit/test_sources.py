"""profiles/sources.py (`profiles check --strict`): which numbers count as sourced, and why the
comments are found from YAML's own positions rather than by scanning the text for '#'."""

from pathlib import Path

from pytest_gpucluster.profiles.sources import is_threshold, unsourced_thresholds

HEAD = "name: t\ndescription: d\ncluster:\n  device: cpu\n  backend: gloo\n"


def unsourced(tmp_path: Path, text: str, name: str = "p") -> list[str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return [".".join(map(str, u.key)) for u in unsourced_thresholds((path,))]


def test_trailing_comment_comment_above_and_source_field(tmp_path):
    text = HEAD + (
        "burnin:\n"
        "  min_cpu_matmul: 7GFLOP/s   # measured here / 5\n"
        "  # the quieter runs / 5\n"
        "  min_cpu_memory_bandwidth: 0.9GB/s\n"
        "  straggler_tolerance: 200%\n"
        "collectives:\n"
        "  checks:\n"
        "    - {collective: all_reduce, size: 1MiB, min_busbw: 1GB/s, source: 'FEASIBILITY.md'}\n"
        "    - {collective: all_reduce, size: 1KiB, max_latency: 5ms}\n"
    )
    assert unsourced(tmp_path, text) == ["burnin.straggler_tolerance", "collectives.checks.1.max_latency"]


def test_a_hash_inside_a_quoted_string_is_not_a_comment(tmp_path):
    text = HEAD + 'versions:\n  nccl: ">=2.21 # not a comment"\n  torch: "2.3" # a real one\n'
    assert unsourced(tmp_path, text) == ["versions.nccl"]


def test_a_comment_line_inside_a_block_scalar_is_not_a_comment(tmp_path):
    text = HEAD.replace("description: d\n", "description: |\n  line one\n  # looks like a comment\n") + (
        "versions:\n  nccl: '>=2.21'\n"
    )
    # the '#' line belongs to the description; 'versions:' sits between it and the pin anyway
    assert unsourced(tmp_path, text) == ["versions.nccl"]
    # the line right above the pin is '# text', the last line of a block scalar: content, not a comment
    tricky = HEAD + "versions:\n  note: |\n    # text\n  nccl: '>=2.21'\n"
    assert unsourced(tmp_path, tricky) == ["versions.note", "versions.nccl"]


def test_a_comment_above_a_section_does_not_source_its_numbers(tmp_path):
    text = HEAD + "# NVLink figures from the datasheet\nnvlink:\n  links_per_gpu: 18\n  min_speedup: 3.0\n"
    assert unsourced(tmp_path, text) == ["nvlink.links_per_gpu", "nvlink.min_speedup"]


def test_a_comment_above_a_list_item_sources_the_item(tmp_path):
    text = HEAD + (
        "sft:\n  cases:\n"
        "    # seed 000: 7.01 s/it\n"
        "    - name: a\n      model: tiny\n      max_step_time: 7.7s\n"
        "    - name: b\n      model: tiny\n      max_step_time: 7.7s\n"
    )
    assert unsourced(tmp_path, text) == ["sft.cases.1.max_step_time"]


def test_a_comment_on_a_multi_line_flow_mapping_line(tmp_path):
    text = HEAD + (
        "collectives:\n  checks:\n"
        "    - {collective: all_reduce, size: 1MiB, min_busbw: 1GB/s,   # quiet VM / 3\n"
        "       scope: intra-node}\n"
    )
    assert unsourced(tmp_path, text) == []


def test_inherited_numbers_are_judged_where_they_are_set(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(HEAD + "nvlink:\n  min_speedup: 3.0\n  links_per_gpu: 18  # datasheet\n")
    child = tmp_path / "child.yaml"
    child.write_text("name: c\ndescription: d\nextends: base\nnvlink:\n  min_speedup: 4.0   # our run\n")
    assert unsourced_thresholds((child, base)) == ()  # the base's 3.0 is overridden
    child.write_text("name: c\ndescription: d\nextends: base\n")
    [item] = unsourced_thresholds((child, base))
    assert item.path == base and item.line == 7 and "min_speedup: 3.0 has no source" in str(item)


def test_a_child_list_replaces_the_parents_whole(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        HEAD + "collectives:\n  checks:\n    - {collective: all_reduce, size: 1MiB, min_busbw: 1GB/s}\n"
    )
    child = tmp_path / "child.yaml"
    child.write_text(
        "name: c\ndescription: d\nextends: base\ncollectives:\n  checks:\n"
        "    - {collective: all_reduce, size: 1KiB, max_latency: 5ms, source: ours}\n"
    )
    assert unsourced_thresholds((child, base)) == ()


def test_what_counts_as_a_threshold():
    assert is_threshold(("collectives", "checks", 0, "min_busbw"))
    assert not is_threshold(("collectives", "sweep", "min_bytes"))
    assert is_threshold(("cluster", "peak_flops")) and not is_threshold(("cluster", "nodes"))
    assert is_threshold(("nccl", "net_plugin", "min_version"))
    assert is_threshold(("burnin", "straggler_tolerance")) and not is_threshold(("burnin", "pair_size"))
    assert is_threshold(("versions", "nccl")) and not is_threshold(("sft", "cases", 0, "timeout"))
