"""Generate the synthetic English -> German demo corpus for Translate (seeded, deterministic).

    python data/make_translate_demo.py [--out-dir data/translate_demo] [--train-size 20000] [--seed 0]

A small grammar and lexicon (about 130 English words) with the reorderings that make
German hard for a word-by-word model:

- verb-second main clauses: a fronted adverb or clause moves the verb before the subject
  ("today the man sees the dog" -> "heute sieht der Mann den Hund");
- verb-final subordinate clauses ("..., weil der Mann den Hund sieht");
- separable verbs: the particle goes to the end of a main clause and rejoins the verb in a
  subordinate one ("he calls his mother" -> "er ruft seine Mutter an", "..., weil er seine Mutter anruft");
- modals send the infinitive to the end ("the man can see the dog" -> "der Mann kann den Hund sehen");
- articles and adjectives agree in gender, number and case (der große Hund, ein großer Hund,
  den großen Hund, mit dem großen Hund), plurals and the dative plural "-n".

The German side is a deterministic function of the English side: every English word maps
to one German lemma (no synonyms), and nothing German depends on a hidden choice. Sentences
are unique across all splits, so test never overlaps train.

Writes `{train,val,test}.{en,de}` (one sentence per line, whitespace-tokenised, "." and ","
as their own tokens) and `{split}.align`: the generator's word alignment in Pharaoh format,
"i-j" = English word i aligned to German word j (0-based). Every English word is aligned;
the only unaligned German words are the commas German puts before subordinate clauses.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.runtime.atomic import atomic_path

CASES = ("nom", "acc", "dat")


@dataclass(frozen=True)
class Noun:
    """A noun: English singular/plural, German singular/plural, German gender, animacy (can be a subject)."""

    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str
    animate: bool


def _nouns(animate: bool, rows: str) -> list[Noun]:
    return [Noun(*row.split(), animate=animate) for row in rows.strip().splitlines()]


NOUNS: dict[str, Noun] = {n.en: n for n in _nouns(True, """
man men Mann Männer m
woman women Frau Frauen f
child children Kind Kinder n
dog dogs Hund Hunde m
cat cats Katze Katzen f
horse horses Pferd Pferde n
friend friends Freund Freunde m
teacher teachers Lehrer Lehrer m
mother mothers Mutter Mütter f
father fathers Vater Väter m
sister sisters Schwester Schwestern f
brother brothers Bruder Brüder m
girl girls Mädchen Mädchen n
bird birds Vogel Vögel m
cook cooks Koch Köche m
""") + _nouns(False, """
house houses Haus Häuser n
book books Buch Bücher n
car cars Auto Autos n
door doors Tür Türen f
window windows Fenster Fenster n
letter letters Brief Briefe m
apple apples Apfel Äpfel m
ball balls Ball Bälle m
flower flowers Blume Blumen f
bottle bottles Flasche Flaschen f
table tables Tisch Tische m
picture pictures Bild Bilder n
song songs Lied Lieder n
cake cakes Kuchen Kuchen m
box boxes Kiste Kisten f
""")}

ADJECTIVES = {
    "big": "groß", "small": "klein", "old": "alt", "young": "jung", "red": "rot", "green": "grün",
    "new": "neu", "beautiful": "schön", "happy": "froh", "tired": "müde",
}


@dataclass(frozen=True)
class Verb:
    """A verb: English base and 3rd-person singular, German infinitive stem forms.

    `de` is the infinitive without a separable particle; `de_1sg`/`de_3sg` the finite
    forms; plural forms equal the infinitive for every verb here.
    """

    en: str
    en_3sg: str
    kind: str  # "intr" (may take "with"), "tr" (object), "sep" (object, separable), "clause" (that-clause)
    de: str
    de_1sg: str
    de_3sg: str
    particle: str = ""

    def de_finite(self, agr: str, joined: bool) -> str:
        """Finite German form for agreement "1sg", "3sg" or "pl"; `joined` keeps the particle on (verb-final)."""
        form = {"1sg": self.de_1sg, "3sg": self.de_3sg, "pl": self.de}[agr]
        return self.particle + form if joined else form

    @property
    def de_infinitive(self) -> str:
        """German infinitive with its particle ("anrufen")."""
        return self.particle + self.de


def _verb(en: str, en_3sg: str, kind: str, de: str, sg1: str = "", sg3: str = "", particle: str = "") -> Verb:
    stem = de[:-2] if de.endswith("en") else de[:-1]
    sg1 = sg1 or stem + "e"
    sg3 = sg3 or stem + ("et" if stem[-1] in "td" else "t")
    return Verb(en, en_3sg, kind, de, sg1, sg3, particle)


VERBS: dict[str, Verb] = {v.en: v for v in [
    _verb("sleep", "sleeps", "intr", "schlafen", sg3="schläft"),
    _verb("sing", "sings", "intr", "singen"),
    _verb("laugh", "laughs", "intr", "lachen"),
    _verb("run", "runs", "intr", "laufen", sg3="läuft"),
    _verb("play", "plays", "intr", "spielen"),
    _verb("work", "works", "intr", "arbeiten"),
    _verb("wait", "waits", "intr", "warten"),
    _verb("dance", "dances", "intr", "tanzen"),
    _verb("talk", "talks", "intr", "sprechen", sg3="spricht"),
    _verb("see", "sees", "tr", "sehen", sg3="sieht"),
    _verb("like", "likes", "tr", "mögen", "mag", "mag"),
    _verb("find", "finds", "tr", "finden"),
    _verb("buy", "buys", "tr", "kaufen"),
    _verb("read", "reads", "tr", "lesen", sg3="liest"),
    _verb("carry", "carries", "tr", "tragen", sg3="trägt"),
    _verb("need", "needs", "tr", "brauchen"),
    _verb("love", "loves", "tr", "lieben"),
    _verb("hear", "hears", "tr", "hören"),
    _verb("visit", "visits", "tr", "besuchen"),
    _verb("wash", "washes", "tr", "waschen", sg3="wäscht"),
    _verb("paint", "paints", "tr", "malen"),
    _verb("call", "calls", "sep", "rufen", particle="an"),
    _verb("invite", "invites", "sep", "laden", sg3="lädt", particle="ein"),
    _verb("open", "opens", "sep", "machen", particle="auf"),
    _verb("close", "closes", "sep", "machen", particle="zu"),
    _verb("watch", "watches", "sep", "schauen", particle="an"),
    _verb("say", "says", "clause", "sagen"),
    _verb("know", "knows", "clause", "wissen", "weiß", "weiß"),
    _verb("think", "thinks", "clause", "denken"),
]}

ANIMATE = [n.en for n in NOUNS.values() if n.animate]
THINGS = [n.en for n in NOUNS.values() if not n.animate]
# What each verb takes as object when sampling (default: any noun), so the demo reads sensibly.
OBJECTS = {"buy": THINGS, "read": ["book", "letter"], "open": ["door", "window", "box", "bottle", "book", "car"],
           "close": ["door", "window", "box", "bottle", "book", "car"], "call": ANIMATE, "invite": ANIMATE,
           "visit": ANIMATE}

MODALS = {"can": {"1sg": "kann", "3sg": "kann", "pl": "können"}, "must": {"1sg": "muss", "3sg": "muss", "pl": "müssen"}}
CONJUNCTIONS = {"because": "weil", "although": "obwohl", "while": "während", "if": "wenn", "that": "dass"}
ADVERBS = {"today": "heute", "tomorrow": "morgen", "now": "jetzt", "often": "oft", "sometimes": "manchmal"}
SUBJECT_PRONOUNS = {"I": ("ich", "1sg"), "he": ("er", "3sg"), "she": ("sie", "3sg"), "it": ("es", "3sg"),
                    "we": ("wir", "pl"), "they": ("sie", "pl")}
OBJECT_PRONOUNS = {"me": {"acc": "mich", "dat": "mir"}, "him": {"acc": "ihn", "dat": "ihm"},
                   "us": {"acc": "uns", "dat": "uns"}, "them": {"acc": "sie", "dat": "ihnen"}}
SAME_PERSON = {"I": "me", "we": "us"}  # "I see me" is not English; such objects are never drawn

# Determiners: "the"; der-word "this"/"these"; ein-words "a" and the possessives.
DEFINITE = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
            "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
            "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
DER_WORD_ENDINGS = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
                    "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"},
                    "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
EIN_WORD_ENDINGS = {"nom": {"m": "", "f": "e", "n": "", "pl": "e"},
                    "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
                    "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
EIN_WORDS = {"a": "ein", "my": "mein", "his": "sein", "her": "ihr", "our": "unser", "their": "ihr"}
# Adjective endings: weak after der/dieser, mixed after ein-words, strong with no article (plural only here).
WEAK = {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
        "dat": dict.fromkeys(("m", "f", "n", "pl"), "en")}
MIXED = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
         "dat": dict.fromkeys(("m", "f", "n", "pl"), "en")}
STRONG_PLURAL = {"nom": "e", "acc": "e", "dat": "en"}


@dataclass(frozen=True)
class NP:
    """A noun phrase: English determiner ("the", "a", "this", a possessive, or None for a bare plural).

    Args:
        noun: English singular noun (a key of NOUNS).
        det: "the", "a", "this" (plural: "these"), "my", "his", "her", "our", "their", or None (plural only).
        adjs: English adjectives (keys of ADJECTIVES), in order.
        plural: plural number.
    """

    noun: str
    det: str | None = "the"
    adjs: tuple[str, ...] = ()
    plural: bool = False


Nominal = NP | str  # a noun phrase or a pronoun


@dataclass(frozen=True)
class Clause:
    """One clause; word order is decided when it is realised (main or subordinate).

    Args:
        subj: subject NP or pronoun (I, he, she, it, we, they).
        verb: English base form (a key of VERBS).
        obj: object NP or pronoun (me, him, us, them) for "tr"/"sep" verbs.
        modal: "can" or "must".
        with_: companion of an intransitive verb: "with" + NP or pronoun (German dative).
        that: the that-clause of "say"/"know"/"think".
    """

    subj: Nominal
    verb: str
    obj: Nominal | None = None
    modal: str | None = None
    with_: Nominal | None = None
    that: Clause | None = None


@dataclass(frozen=True)
class Sentence:
    """A main clause with an optional fronted adverb or a subordinate clause before or after it.

    Args:
        main: the main clause.
        adverb: fronted adverb (a key of ADVERBS); German then puts the verb before the subject.
        conj: subordinating conjunction of `sub` ("because", "although", "while", "if").
        sub: the subordinate clause.
        sub_first: put the subordinate clause first ("because ..., the man sings").
    """

    main: Clause
    adverb: str | None = None
    conj: str | None = None
    sub: Clause | None = None
    sub_first: bool = False


@dataclass(frozen=True)
class SentencePair:
    """A generated pair and its word alignment ((English index, German index) pairs, sorted)."""

    en: str
    de: str
    alignment: tuple[tuple[int, int], ...]

    def pharaoh(self) -> str:
        """The alignment as "i-j i-j ..."."""
        return " ".join(f"{i}-{j}" for i, j in self.alignment)


# ----------------------------------------------------------------------------- realisation


@dataclass
class _Builder:
    """Collects both sides; English words are added first, German words point back at them."""

    en: list[str] = field(default_factory=list)
    de: list[str] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)

    def en_word(self, word: str) -> int:
        self.en.append(word)
        return len(self.en) - 1

    def de_word(self, word: str, *en_ids: int) -> None:
        self.links += [(i, len(self.de)) for i in en_ids]
        self.de.append(word)


@dataclass
class _NPIdx:
    head: int  # the noun or pronoun
    det: int | None = None
    adjs: list[int] = field(default_factory=list)


@dataclass
class _ClauseIdx:
    subj: _NPIdx
    verb: int
    conj: int | None = None
    modal: int | None = None
    obj: _NPIdx | None = None
    with_: int | None = None
    with_np: _NPIdx | None = None
    that: _ClauseIdx | None = None


def _check_np(x: Nominal, role: str) -> None:
    pronouns = SUBJECT_PRONOUNS if role == "subj" else OBJECT_PRONOUNS
    if isinstance(x, str):
        if x not in pronouns:
            raise ValueError(f"{x!r} is not a {role} pronoun; use one of {sorted(pronouns)}")
        return
    if x.noun not in NOUNS or any(a not in ADJECTIVES for a in x.adjs):
        raise ValueError(f"unknown noun or adjective in {x}")
    if x.det not in ("the", "this", None, *EIN_WORDS):
        raise ValueError(f"unknown determiner {x.det!r} in {x}")
    if (x.det == "a" and x.plural) or (x.det is None and not x.plural):
        raise ValueError(f"{x}: 'a' needs a singular noun, a bare noun a plural")


def _agreement(x: Nominal) -> str:
    if isinstance(x, str):
        return SUBJECT_PRONOUNS[x][1]
    return "pl" if x.plural else "3sg"


def _en_np(b: _Builder, x: Nominal) -> _NPIdx:
    if isinstance(x, str):
        return _NPIdx(head=b.en_word(x))
    noun = NOUNS[x.noun]
    words = [*x.adjs, noun.en_pl if x.plural else noun.en]
    det = None
    if x.det == "a":
        det = b.en_word("an" if words[0][0] in "aeiou" else "a")
    elif x.det == "this":
        det = b.en_word("these" if x.plural else "this")
    elif x.det is not None:
        det = b.en_word(x.det)
    adjs = [b.en_word(a) for a in x.adjs]
    return _NPIdx(head=b.en_word(words[-1]), det=det, adjs=adjs)


def _en_clause(b: _Builder, c: Clause, conj: str | None) -> _ClauseIdx:
    verb = VERBS.get(c.verb)
    if verb is None or c.modal not in (None, *MODALS):
        raise ValueError(f"unknown verb {c.verb!r} or modal {c.modal!r}")
    _check_np(c.subj, "subj")
    if (c.obj is not None) != (verb.kind in ("tr", "sep")) or (c.that is not None) != (verb.kind == "clause"):
        raise ValueError(f"{c.verb!r} is a {verb.kind!r} verb: object or that-clause does not fit in {c}")
    if c.with_ is not None and verb.kind != "intr":
        raise ValueError(f"'with' goes with intransitive verbs only, not {c.verb!r}")
    conj_i = None if conj is None else b.en_word(conj)
    subj = _en_np(b, c.subj)
    modal = None if c.modal is None else b.en_word(c.modal)
    third_singular = c.modal is None and _agreement(c.subj) == "3sg"
    idx = _ClauseIdx(subj=subj, verb=b.en_word(verb.en_3sg if third_singular else verb.en), conj=conj_i, modal=modal)
    if c.obj is not None:
        _check_np(c.obj, "obj")
        idx.obj = _en_np(b, c.obj)
    if c.with_ is not None:
        _check_np(c.with_, "obj")
        idx.with_, idx.with_np = b.en_word("with"), _en_np(b, c.with_)
    if c.that is not None:
        idx.that = _en_clause(b, c.that, "that")
    return idx


def _inflect(adj: str, ending: str) -> str:
    return adj + (ending[1:] if adj.endswith("e") and ending.startswith("e") else ending)


def _de_np(b: _Builder, x: Nominal, case: str, idx: _NPIdx) -> None:
    if isinstance(x, str):
        b.de_word(SUBJECT_PRONOUNS[x][0] if case == "nom" else OBJECT_PRONOUNS[x][case], idx.head)
        return
    noun = NOUNS[x.noun]
    key = "pl" if x.plural else noun.gender
    if x.det is None:
        ending = STRONG_PLURAL[case]
    elif x.det == "the":
        b.de_word(DEFINITE[case][key], idx.det)
        ending = WEAK[case][key]
    elif x.det == "this":
        b.de_word("dies" + DER_WORD_ENDINGS[case][key], idx.det)
        ending = WEAK[case][key]
    else:
        b.de_word(EIN_WORDS[x.det] + EIN_WORD_ENDINGS[case][key], idx.det)
        ending = MIXED[case][key]
    for adj, i in zip(x.adjs, idx.adjs, strict=True):
        b.de_word(_inflect(ADJECTIVES[adj], ending), i)
    word = noun.de_pl if x.plural else noun.de
    if x.plural and case == "dat" and word[-1] not in "ns":
        word += "n"  # dative plural: den Hunden, den Kindern
    b.de_word(word, idx.head)


def _de_middle(b: _Builder, c: Clause, idx: _ClauseIdx) -> None:
    """Object, then the with-phrase: the German middle field."""
    if c.obj is not None:
        _de_np(b, c.obj, "acc", idx.obj)
    if c.with_ is not None:
        b.de_word("mit", idx.with_)
        _de_np(b, c.with_, "dat", idx.with_np)


def _de_main(b: _Builder, c: Clause, idx: _ClauseIdx, fronted: Callable[[], None] | None) -> None:
    """Verb-second: [subject | fronted] finite-verb [subject] middle [infinitive | particle] [, dass ...]."""
    verb, agr = VERBS[c.verb], _agreement(c.subj)
    if fronted is None:
        _de_np(b, c.subj, "nom", idx.subj)
    else:
        fronted()
    if c.modal is not None:
        b.de_word(MODALS[c.modal][agr], idx.modal)
    else:
        b.de_word(verb.de_finite(agr, joined=False), idx.verb)
    if fronted is not None:
        _de_np(b, c.subj, "nom", idx.subj)
    _de_middle(b, c, idx)
    if c.modal is not None:
        b.de_word(verb.de_infinitive, idx.verb)
    elif verb.particle:
        b.de_word(verb.particle, idx.verb)
    if c.that is not None:
        b.de_word(",")
        _de_sub(b, c.that, "that", idx.that)


def _de_sub(b: _Builder, c: Clause, conj: str, idx: _ClauseIdx) -> None:
    """Verb-final: conjunction subject middle [infinitive] finite-verb [, dass ...]."""
    verb, agr = VERBS[c.verb], _agreement(c.subj)
    b.de_word(CONJUNCTIONS[conj], idx.conj)
    _de_np(b, c.subj, "nom", idx.subj)
    _de_middle(b, c, idx)
    if c.modal is not None:
        b.de_word(verb.de_infinitive, idx.verb)
        b.de_word(MODALS[c.modal][agr], idx.modal)
    else:
        b.de_word(verb.de_finite(agr, joined=True), idx.verb)
    if c.that is not None:
        b.de_word(",")
        _de_sub(b, c.that, "that", idx.that)


def realize(s: Sentence) -> SentencePair:
    """English and German surface strings of a sentence, with their word alignment.

    Args:
        s: the sentence; invalid combinations (a plural with "a", an object on an
            intransitive verb, ...) raise ValueError.
    """
    if (s.sub is None) != (s.conj is None) or s.conj not in (None, *CONJUNCTIONS) or s.conj == "that":
        raise ValueError(f"`conj` ({s.conj!r}) and `sub` go together; conj is one of because/although/while/if")
    if s.sub_first and (s.sub is None or s.adverb is not None):
        raise ValueError("`sub_first` needs a subordinate clause and no fronted adverb")
    if s.adverb not in (None, *ADVERBS):
        raise ValueError(f"unknown adverb {s.adverb!r}")
    b = _Builder()
    sub = comma = adverb = None
    if s.sub_first:
        sub, comma = _en_clause(b, s.sub, s.conj), b.en_word(",")
    if s.adverb is not None:
        adverb = b.en_word(s.adverb)
    main = _en_clause(b, s.main, None)
    if s.sub is not None and not s.sub_first:
        sub = _en_clause(b, s.sub, s.conj)
    stop = b.en_word(".")

    def front_sub() -> None:
        _de_sub(b, s.sub, s.conj, sub)
        b.de_word(",", comma)

    fronted = front_sub if s.sub_first else None
    if adverb is not None:
        fronted = lambda: b.de_word(ADVERBS[s.adverb], adverb)  # noqa: E731
    _de_main(b, s.main, main, fronted)
    if s.sub is not None and not s.sub_first:
        b.de_word(",")
        _de_sub(b, s.sub, s.conj, sub)
    b.de_word(".", stop)
    return SentencePair(" ".join(b.en), " ".join(b.de), tuple(sorted(b.links)))


# ----------------------------------------------------------------------------- sampling


def _random_np(rng: random.Random, nouns: list[str]) -> NP:
    noun = rng.choice(nouns)
    plural = rng.random() < 0.3
    dets = ["the", "this", "my", "his", "her", "our", "their", "a" if not plural else None]
    det = rng.choices(dets, weights=[8, 2, 1, 1, 1, 1, 1, 5])[0]
    n_adjs = rng.choices([0, 1, 2], weights=[10, 7, 2])[0]
    return NP(noun, det, tuple(rng.sample(sorted(ADJECTIVES), n_adjs)), plural)


def _random_clause(rng: random.Random, allow_that: bool) -> Clause:
    subj: Nominal = rng.choice(sorted(SUBJECT_PRONOUNS)) if rng.random() < 0.3 else _random_np(rng, ANIMATE)
    kinds = ["intr", "tr", "sep", "clause"] if allow_that else ["intr", "tr", "sep"]
    kind = rng.choices(kinds, weights=[6, 9, 5, 4][: len(kinds)])[0]
    verb = rng.choice([v.en for v in VERBS.values() if v.kind == kind])
    modal = rng.choice(sorted(MODALS)) if kind != "clause" and rng.random() < 0.2 else None
    nouns = ANIMATE if kind == "intr" else OBJECTS.get(verb, list(NOUNS))

    def companion() -> Nominal:
        pronouns = [p for p in sorted(OBJECT_PRONOUNS) if SAME_PERSON.get(subj) != p]
        if set(nouns) & set(ANIMATE) and rng.random() < 0.15:
            return rng.choice(pronouns)
        return _random_np(rng, nouns)

    obj = companion() if kind in ("tr", "sep") else None
    with_ = companion() if kind == "intr" and rng.random() < 0.4 else None
    that = _random_clause(rng, allow_that=False) if kind == "clause" else None
    return Clause(subj, verb, obj, modal, with_, that)


def random_sentence(rng: random.Random) -> Sentence:
    """Draw one sentence from the grammar."""
    main = _random_clause(rng, allow_that=True)
    shape = rng.choices(["plain", "adverb", "sub_after", "sub_first"], weights=[4, 3, 3, 2])[0]
    if main.that is not None and shape == "sub_first":
        shape = "plain"  # keep sentences short: one subordinate clause at most
    adverb = rng.choice(sorted(ADVERBS)) if shape == "adverb" or shape == "sub_after" and rng.random() < 0.3 else None
    if shape in ("sub_after", "sub_first") and main.that is None:
        conj = rng.choice(["because", "although", "while", "if"])
        return Sentence(main, adverb, conj, _random_clause(rng, allow_that=False), shape == "sub_first")
    return Sentence(main, adverb)


def generate(train_size: int = 20000, val_size: int = 500, test_size: int = 500, seed: int = 0
             ) -> dict[str, list[SentencePair]]:
    """Draw unique sentence pairs for each split (no English sentence appears twice anywhere).

    Args:
        train_size: training pairs.
        val_size: validation pairs.
        test_size: test pairs.
        seed: seed of the draw; the same arguments give the same corpus.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[SentencePair]] = {}
    for name, size in (("train", train_size), ("val", val_size), ("test", test_size)):
        pairs: list[SentencePair] = []
        for _ in range(100 * size + 1000):
            if len(pairs) == size:
                break
            pair = realize(random_sentence(rng))
            if pair.en not in seen:
                seen.add(pair.en)
                pairs.append(pair)
        if len(pairs) < size:
            raise ValueError(f"could only draw {len(pairs)} unique {name} sentences; ask for fewer")
        splits[name] = pairs
    return splits


def write_corpus(splits: dict[str, list[SentencePair]], out_dir: str | Path) -> None:
    """Write `{split}.en`, `{split}.de` and `{split}.align` under `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, pairs in splits.items():
        for suffix, lines in (("en", [p.en for p in pairs]), ("de", [p.de for p in pairs]),
                              ("align", [p.pharaoh() for p in pairs])):
            with atomic_path(out / f"{name}.{suffix}") as tmp:  # an interrupted run leaves no half file
                tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "translate_demo"),
                        help="output directory (default: data/translate_demo next to this script)")
    parser.add_argument("--train-size", type=int, default=20000, help="training pairs")
    parser.add_argument("--val-size", type=int, default=500, help="validation pairs")
    parser.add_argument("--test-size", type=int, default=500, help="test pairs")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    splits = generate(args.train_size, args.val_size, args.test_size, args.seed)
    write_corpus(splits, args.out_dir)
    sizes = ", ".join(f"{k} {len(v)}" for k, v in splits.items())
    print(f"wrote {sizes} pairs to {args.out_dir} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
