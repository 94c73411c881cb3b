"""What a variant is (attnres.variants): its names, its place in the figures' order, whether it is AttnRes in the
paper's form, and its one-line description."""

from __future__ import annotations

from attnres.variants import Variant, curve_order


def test_a_label_or_a_curve_name_parses_and_other_text_is_a_variant_name():
    assert Variant.parse("block-N4") == Variant("block", 4)
    assert Variant.parse("block4") == Variant("block", 4)
    assert Variant.parse("block4+heads16") == Variant("block+heads16", 4)
    assert Variant.parse("block+heads16-N4") == Variant("block+heads16", 4)
    assert Variant.parse("full+sigmoid") == Variant("full+sigmoid")
    assert Variant.parse_main("block8") == Variant("block", 8) and Variant.parse_main("full+sigmoid") is None


def test_a_variant_as_its_curve_names_it_keeps_n_only_for_one_n_of_several():
    assert Variant("block", 4).as_named("block-N4") == Variant("block", 4)  # split: the name says N
    assert Variant("block", 4).as_named("block") == Variant("block")  # one N per size: every N's
    assert Variant("block+heads16", 4).as_named("block+heads16-N4") == Variant("block+heads16", 4)
    assert Variant("full").as_named("full") == Variant("full")
    assert Variant("block").as_named("block") == Variant("block")


def test_order_groups_baselines_full_block_by_n_then_anything_else():
    variants = [Variant("baseline"), Variant("mhc4"), Variant("full"), Variant("full+sigmoid"), Variant("block", 2)]
    order = [v.order for v in [*variants, Variant("x")]]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert Variant("block", 2).order < Variant("block", 8).order < Variant("block+heads16").order
    of = {
        "x": Variant("x"),
        "block-N8": Variant("block", 8),
        "block-N2": Variant("block", 2),
        "full": Variant("full"),
        "denseformer": Variant("denseformer"),
        "baseline": Variant("baseline"),
    }
    assert curve_order(["x", "block-N8", "block-N2", "full", "denseformer", "baseline", "full"], of) == [
        "baseline",
        "denseformer",
        "full",
        "block-N2",
        "block-N8",
        "x",
    ]
    # the order is the variants', never the names': a curve is sorted by the variant it is handed
    assert curve_order(["b", "a"], {"a": Variant("block", 8), "b": Variant("full")}) == ["b", "a"]


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
