"""The demo corpus generator: determinism, disjoint splits, valid alignments, and hand-written
translations of the German phenomena it exists to teach (verb-second, verb-final, separable
verbs, modals, adjective and article agreement, plurals)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def corpus(demo):
    return demo.generate(train_size=2000, val_size=200, test_size=200, seed=0)


def test_generation_is_deterministic_for_a_seed(demo):
    assert demo.generate(200, 20, 20, seed=5) == demo.generate(200, 20, 20, seed=5)
    assert demo.generate(200, 20, 20, seed=5) != demo.generate(200, 20, 20, seed=6)


def test_splits_are_disjoint_and_unique(corpus):
    sources = {name: [p.en for p in pairs] for name, pairs in corpus.items()}
    assert [len(s) for s in sources.values()] == [2000, 200, 200]
    assert all(len(set(s)) == len(s) for s in sources.values())
    assert not set(sources["test"]) & set(sources["train"])
    assert not set(sources["val"]) & set(sources["train"])
    assert not set(sources["test"]) & set(sources["val"])


def test_translation_is_a_function_of_the_source(demo):
    seen: dict[str, str] = {}
    for seed in (0, 1):
        for pair in demo.generate(3000, 0, 0, seed=seed)["train"]:
            assert seen.setdefault(pair.en, pair.de) == pair.de


def test_alignments_are_valid_index_pairs(corpus):
    for pair in (p for pairs in corpus.values() for p in pairs):
        en, de = pair.en.split(), pair.de.split()
        assert all(0 <= i < len(en) and 0 <= j < len(de) for i, j in pair.alignment)
        assert list(pair.alignment) == sorted(set(pair.alignment))
        assert {i for i, _ in pair.alignment} == set(range(len(en)))  # every English word is aligned
        unaligned = set(range(len(de))) - {j for _, j in pair.alignment}
        assert all(de[j] == "," for j in unaligned)  # only the commas German adds before clauses


def test_lexicon_is_small(corpus):
    english = {w for pairs in corpus.values() for p in pairs for w in p.en.split()}
    german = {w for pairs in corpus.values() for p in pairs for w in p.de.split()}
    assert len(english) <= 200 and len(german) <= 320


def test_phenomena_occur_in_the_corpus(corpus):
    german = [p.de for p in corpus["train"]]
    for marker in (", weil", ", dass", "heute ", " an .", " kann ", "Hunden"):
        assert any(marker in s for s in german), marker


def pair(demo, main, **sentence):
    p = demo.realize(demo.Sentence(main, **sentence))
    return p.en, p.de


def test_verb_second_after_fronted_adverb(demo):
    NP, Clause = demo.NP, demo.Clause
    p = demo.realize(demo.Sentence(Clause(NP("man"), "see", obj=NP("dog")), adverb="today"))
    assert (p.en, p.de) == ("today the man sees the dog .", "heute sieht der Mann den Hund .")
    assert p.pharaoh() == "0-0 1-2 2-3 3-1 4-4 5-5 6-6"


def test_subordinate_clause_puts_the_verb_last(demo):
    NP, Clause = demo.NP, demo.Clause
    assert pair(demo, Clause("she", "sing"), conj="because", sub=Clause(NP("man"), "see", obj=NP("dog"))) == (
        "she sings because the man sees the dog .",
        "sie singt , weil der Mann den Hund sieht .",
    )
    assert pair(demo, Clause(NP("man"), "know", that=Clause(NP("dog"), "sleep"))) == (
        "the man knows that the dog sleeps .",
        "der Mann weiß , dass der Hund schläft .",
    )


def test_fronted_subordinate_clause_inverts_the_main_clause(demo):
    NP, Clause = demo.NP, demo.Clause
    assert pair(demo, Clause(NP("man"), "sing"), conj="because", sub=Clause(NP("dog"), "sleep"), sub_first=True) == (
        "because the dog sleeps , the man sings .",
        "weil der Hund schläft , singt der Mann .",
    )


def test_separable_verb_splits_in_main_and_joins_in_subordinate_clause(demo):
    NP, Clause = demo.NP, demo.Clause
    calls = Clause("he", "call", obj=NP("mother", det="his"))
    p = demo.realize(demo.Sentence(calls))
    assert (p.en, p.de) == ("he calls his mother .", "er ruft seine Mutter an .")
    assert p.pharaoh() == "0-0 1-1 1-4 2-2 3-3 4-5"  # "calls" aligns to both "ruft" and "an"
    assert pair(demo, Clause(NP("dog"), "sleep"), conj="while", sub=calls) == (
        "the dog sleeps while he calls his mother .",
        "der Hund schläft , während er seine Mutter anruft .",
    )


def test_modal_sends_the_infinitive_to_the_end(demo):
    NP, Clause = demo.NP, demo.Clause
    opens = Clause(NP("woman"), "open", obj=NP("door"), modal="can")
    assert pair(demo, opens) == ("the woman can open the door .", "die Frau kann die Tür aufmachen .")
    assert pair(demo, Clause("I", "laugh"), conj="if", sub=opens) == (
        "I laugh if the woman can open the door .",
        "ich lache , wenn die Frau die Tür aufmachen kann .",
    )


def test_adjective_endings_agree_with_article_gender_and_case(demo):
    NP, Clause = demo.NP, demo.Clause
    big = ("big",)
    assert pair(demo, Clause(NP("dog", "a", big), "see", obj=NP("dog", "the", big))) == (
        "a big dog sees the big dog .",
        "ein großer Hund sieht den großen Hund .",
    )
    assert pair(demo, Clause(NP("dog", "the", big), "find", obj=NP("house", "a", big))) == (
        "the big dog finds a big house .",
        "der große Hund findet ein großes Haus .",
    )
    assert pair(demo, Clause(NP("cat", "a", ("tired",)), "play", with_=NP("dog", "her", ("old",)))) == (
        "a tired cat plays with her old dog .",
        "eine müde Katze spielt mit ihrem alten Hund .",
    )
    assert pair(demo, Clause(NP("man", "this", ("young", "happy")), "buy", obj=NP("apple", "a"))) == (
        "this young happy man buys an apple .",
        "dieser junge frohe Mann kauft einen Apfel .",
    )


def test_plurals_and_dative_plural(demo):
    NP, Clause = demo.NP, demo.Clause
    assert pair(demo, Clause(NP("child", plural=True), "play", with_=NP("dog", "my", ("small",), plural=True))) == (
        "the children play with my small dogs .",
        "die Kinder spielen mit meinen kleinen Hunden .",
    )
    assert pair(demo, Clause(NP("bird", None, ("red",), plural=True), "like", obj="them"), adverb="often") == (
        "often red birds like them .",
        "oft mögen rote Vögel sie .",
    )


def test_invalid_constructions_are_rejected(demo):
    NP, Clause = demo.NP, demo.Clause
    with pytest.raises(ValueError, match="'a' needs a singular noun"):
        demo.realize(demo.Sentence(Clause(NP("dog", "a", plural=True), "sleep")))
    with pytest.raises(ValueError, match="'sleep' is a 'intr' verb"):
        demo.realize(demo.Sentence(Clause(NP("dog"), "sleep", obj=NP("cat"))))


def test_command_line_writes_every_file(demo, tmp_path):
    demo.main(["--out-dir", str(tmp_path), "--train-size", "50", "--val-size", "5", "--test-size", "5", "--seed", "2"])
    for split, size in (("train", 50), ("val", 5), ("test", 5)):
        files = [(tmp_path / f"{split}.{suffix}").read_text(encoding="utf-8") for suffix in ("en", "de", "align")]
        assert [text.count("\n") for text in files] == [size] * 3
        first = [text.splitlines()[0] for text in files]
        assert first[2] == " ".join(f"{i}-{j}" for i, j in demo.generate(50, 5, 5, seed=2)[split][0].alignment)


def test_default_corpus_has_the_documented_split_sizes(demo):
    splits = demo.generate()
    assert [len(v) for v in splits.values()] == [20000, 500, 500]
