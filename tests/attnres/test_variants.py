"""What a variant is (attnres.variants): its names, its place in the figures' order, whether it is AttnRes in the
paper's form, and its one-line description."""

from __future__ import annotations

from attnres.variants import Variant, curve_order


def test_a_curve_name_reads_back_as_its_variant_and_a_block_curve_takes_n_only_where_its_name_is_silent():
    assert Variant.of_curve("block-N4") == Variant("block", 4)
    assert Variant.of_curve("block-N4", 8) == Variant("block", 4)  # the name says N
    assert Variant.of_curve("block", 8) == Variant("block", 8)
    assert Variant.of_curve("block+heads16", 8) == Variant("block+heads16")  # N only for Block AttnRes itself
    assert Variant.of_curve("block4") == Variant("block4")  # a label is not a curve name
    assert Variant.of_curve("full+sigmoid") == Variant("full+sigmoid")


def test_order_groups_baselines_full_block_by_n_then_anything_else():
    order = [Variant.of_curve(c).order for c in ("baseline", "mhc4", "full", "full+sigmoid", "block-N2", "x")]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert Variant("block", 2).order < Variant("block", 8).order < Variant("block+heads16").order
    assert curve_order(["x", "block-N8", "block-N2", "full", "denseformer", "baseline", "full"]) == [
        "baseline",
        "denseformer",
        "full",
        "block-N2",
        "block-N8",
        "x",
    ]


def test_attnres_and_main_variants():
    assert Variant("full").is_attnres and Variant("block", 4).is_attnres and Variant("block").is_attnres
    assert not Variant("full+sigmoid").is_attnres and not Variant("baseline").is_attnres
    assert Variant("baseline").is_main and Variant("block", 2).is_main and not Variant("hc4").is_main


def test_descriptions_name_the_residual_kind_and_each_tag():
    assert Variant("block", 4).description == "Block AttnRes, N = 4"
    assert Variant("full+sigmoid").description == "Full AttnRes, sigmoid instead of softmax"
    assert Variant("block+heads16+window8").description == (
        "Block AttnRes, 16-head depth attention, sliding window over the last 8 outputs + embedding"
    )
    assert Variant("mhc4").description == "manifold-constrained Hyper-Connections (mHC), 4 streams"
    assert Variant("baseline").description == "PreNorm residual stream (baseline)"
