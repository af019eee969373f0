"""Deterministic synthetic StreamRec data: a catalogue of series with genres, and viewing logs.

Planted patterns (what a sequential model can learn and a popularity ranking cannot):

- next in series: items are episodes of series; after episode k the user watches episode
  k + 1 with probability `p_next` (default 0.6) whenever there is one;
- long-range returns: with probability `p_return` the user goes back to an item from at least
  10 steps earlier (a re-watch) or starts a series in the genre of such an item;
- otherwise a new series, picked by Zipf popularity, mostly from the user's two favourite
  genres, usually from episode 1.

Timestamps increase per user (minutes apart inside a session, hours to days between sessions);
rows are written in global time order. Ids are strings ("u0001", "v0042").

    python data/make_streamrec_demo.py                     # data/streamrec_demo/interactions.csv
    python data/make_streamrec_demo.py --users 200 --out /tmp/demo.csv

`generate(...)` returns the rows for tests and scripts; `make_catalogue(...)` the items.
"""

from __future__ import annotations

import argparse
import csv
import random
import time
from dataclasses import dataclass
from pathlib import Path

from core.runtime.atomic import atomic_path

START_TIME = 1_700_000_000  # 2023-11-14, Unix seconds
MIN_RETURN_GAP = 10  # a "long-range" return goes back at least this many steps


@dataclass(frozen=True)
class Item:
    """One catalogue entry.

    Args:
        item_id: string id, e.g. "v0042".
        series: series index.
        episode: 1-based position in the series.
        genre: genre index.
    """

    item_id: str
    series: int
    episode: int
    genre: int

    @property
    def title(self) -> str:
        """The display name explanation pages show, e.g. "Series 12, episode 3"."""
        return f"Series {self.series}, episode {self.episode}"


def make_catalogue(items: int = 500, genres: int = 12, seed: int = 0) -> list[Item]:
    """Items grouped into series of 2..8 episodes, each series in one genre.

    Args:
        items: catalogue size.
        genres: number of genres.
        seed: random seed.
    """
    rng = random.Random(seed)
    width = max(4, len(str(items)))
    catalogue: list[Item] = []
    series = 0
    while len(catalogue) < items:
        length = min(rng.randint(2, 8), items - len(catalogue))
        genre = rng.randrange(genres)
        for episode in range(1, length + 1):
            catalogue.append(Item(f"v{len(catalogue) + 1:0{width}d}", series, episode, genre))
        series += 1
    return catalogue


def generate(
    users: int = 2000, items: int = 500, seed: int = 0, min_len: int = 20, max_len: int = 60, p_next: float = 0.6,
    p_return: float = 0.1, genres: int = 12, zipf: float = 1.1,
) -> list[tuple[str, str, int]]:
    """Viewing logs with planted series-successor and long-range-return patterns.

    Args:
        users: number of users.
        items: catalogue size.
        seed: random seed (same arguments, same rows).
        min_len: fewest interactions per user.
        max_len: most interactions per user.
        p_next: probability of watching the next episode when there is one.
        p_return: probability of a long-range return (re-watch or a genre seen long ago).
        genres: number of genres.
        zipf: exponent of the series popularity law.

    Returns:
        (user_id, item_id, timestamp) rows in time order (per-user timestamps strictly increase).
    """
    if users < 1 or items < 2 or not 1 <= min_len <= max_len:
        raise ValueError(f"need users >= 1, items >= 2 and 1 <= min_len <= max_len; got {users}, {items}, "
                         f"{min_len}, {max_len}")
    catalogue = make_catalogue(items, genres, seed)
    rng = random.Random(seed + 1)
    n_series = catalogue[-1].series + 1
    firsts = [i for i, it in enumerate(catalogue) if it.episode == 1]  # first episode of each series
    popularity = [0.0] * n_series
    for rank, s in enumerate(rng.sample(range(n_series), n_series)):
        popularity[s] = 1.0 / (rank + 1) ** zipf
    by_genre = [[s for s in range(n_series) if catalogue[firsts[s]].genre == g] for g in range(genres)]
    successor = [i + 1 if i + 1 < len(catalogue) and catalogue[i + 1].series == it.series else None
                 for i, it in enumerate(catalogue)]

    def new_series(genre_pool: list[int]) -> int:
        pool = genre_pool or list(range(n_series))
        s = rng.choices(pool, weights=[popularity[x] for x in pool])[0]
        start = firsts[s]
        if rng.random() < 0.2:  # sometimes jump into the middle of a series
            length = sum(1 for it in catalogue[start:start + 8] if it.series == s)
            start += rng.randrange(length)
        return start

    rows: list[tuple[str, str, int]] = []
    width = max(4, len(str(users)))
    for u in range(users):
        favourites = rng.sample(range(genres), min(2, genres))
        favourite_series = [s for g in favourites for s in by_genre[g]]
        clock = START_TIME + rng.randrange(60 * 86_400)
        history = [new_series(favourite_series)]
        for _ in range(rng.randint(min_len, max_len) - 1):
            prev, r = history[-1], rng.random()
            if r < p_next and successor[prev] is not None:
                nxt = successor[prev]
            elif r < p_next + p_return and len(history) > MIN_RETURN_GAP:
                earlier = history[rng.randrange(len(history) - MIN_RETURN_GAP)]
                nxt = earlier if rng.random() < 0.5 else new_series(by_genre[catalogue[earlier].genre])
            else:
                nxt = new_series(favourite_series if rng.random() < 0.7 else [])
            history.append(nxt)
        for step, i in enumerate(history):
            if step:  # episodes minutes apart; 15% of steps open a new session hours or days later
                clock += rng.randint(6 * 3600, 7 * 86_400) if rng.random() < 0.15 else rng.randint(60, 3600)
            rows.append((f"u{u + 1:0{width}d}", catalogue[i].item_id, clock))
    rows.sort(key=lambda r: r[2])  # stable: equal timestamps keep user order
    return rows


def write_csv(rows: list[tuple[str, str, int]], path: str | Path) -> Path:
    """Write rows as `user_id,item_id,timestamp` CSV (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:  # an interrupted run leaves no half file
        writer = csv.writer(f)
        writer.writerow(["user_id", "item_id", "timestamp"])
        writer.writerows(rows)
    return path


def write_catalogue(catalogue: list[Item], path: str | Path) -> Path:
    """Write items as `item_id,title,series,episode,genre` CSV (the titles for `streamrec.explain --items`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:  # an interrupted run leaves no half file
        writer = csv.writer(f)
        writer.writerow(["item_id", "title", "series", "episode", "genre"])
        writer.writerows((it.item_id, it.title, it.series, it.episode, f"genre{it.genre:02d}") for it in catalogue)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/streamrec_demo/interactions.csv", help="interactions CSV to write")
    parser.add_argument("--users", type=int, default=2000, help="number of users")
    parser.add_argument("--items", type=int, default=500, help="catalogue size")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = generate(users=args.users, items=args.items, seed=args.seed)
    out = write_csv(rows, args.out)
    items_out = write_catalogue(make_catalogue(args.items, seed=args.seed), out.with_name("items.csv"))
    print(f"wrote {len(rows)} interactions of {args.users} users on {args.items} items to {out} "
          f"(catalogue: {items_out}) in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
