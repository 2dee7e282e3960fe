"""ALFWorld-style household tasks, generated offline and played on TextWorld (the `household` game).

ALFWorld (Shridhar et al., 2021) poses six household task types in one room of a house; its own
games are PDDL problems drawn from ALFRED's recorded trajectories, a download arle cannot reach,
and TextWorld plays PDDL only with a planner built from source. arle generates games of the same
six types with TextWorld's own game maker instead: TextWorld's logic (take, put, insert, open,
close, examine, look, inventory) plus the four verbs ALFWorld adds (household_data/household.twl:
heat with a microwave, cool with a fridge, clean with a sink basin, use a desk lamp), compiled by
TextWorld's Inform 7 and played on its z-machine like the other textworld games.

A game is one room of one of ALFWorld's four scene kinds (kitchen, living room, bedroom,
bathroom), receptacles named as ALFWorld names them (`cabinet 1`, `countertop 2`: containers
closed at the start, a garbage can open), the task's objects and `distractors` other objects,
and one goal in ALFWorld's words ("Your task is to: put a hot apple in fridge."):

- pick_and_place_simple: put an X in/on a Y
- pick_two_obj_and_place: put two X in/on one Y
- pick_clean_then_place_in_recep / pick_heat_then_place_in_recep / pick_cool_then_place_in_recep:
  clean / heat / cool an X with the sink basin / microwave / fridge, then put it in/on a Y
- look_at_obj_in_light: hold an X and turn on the desk lamp

As in ALFWorld, any object of the kind and any receptacle of the kind counts (one winning event
per choice). The layout is drawn from the game seed alone (`plan`), so a seed is the same game
on every machine; the walkthrough is the shortest plan arle knows (open, take, the verb, open,
put), checked against TextWorld's logic when the game is made (and played on its engine by the tests).
"""

from __future__ import annotations

import functools
import glob
import importlib
import itertools
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlecli.errors import UserError

# In every household game's cache key: bump it whenever a seed's game changes (plan, the logic
# or the grammar), so cached and shipped games of the old generator are never played as new.
VERSION = 1
TASKS = (
    "pick_and_place_simple",
    "pick_two_obj_and_place",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "look_at_obj_in_light",
)
# The TextWorld type of each receptacle kind: c container (closed at the start), s supporter;
# heater, cooler and basin are household.twl's appliances; `open` a container that is never closed.
RECEPTACLES = {
    "cabinet": "c", "drawer": "c", "fridge": "cooler", "microwave": "heater", "garbagecan": "open",
    "safe": "c", "dresser": "c", "countertop": "s", "diningtable": "s", "shelf": "s", "sinkbasin": "basin",
    "desk": "s", "sidetable": "s", "bed": "s", "sofa": "s", "coffeetable": "s", "tvstand": "s",
    "armchair": "s", "toilet": "s", "towelholder": "s", "bathtubbasin": "s",
}  # fmt: skip


@dataclass(frozen=True)
class Scene:
    """One of ALFWorld's scene kinds: its receptacles (kind -> how many, min and max) and objects."""

    room: str
    receptacles: dict[str, tuple[int, int]]
    objects: tuple[str, ...]


SCENES = {
    "kitchen": Scene(
        "kitchen",
        {"cabinet": (2, 4), "drawer": (1, 3), "countertop": (1, 2), "fridge": (1, 1), "microwave": (1, 1),
         "sinkbasin": (1, 1), "diningtable": (1, 1), "shelf": (0, 2), "garbagecan": (1, 1)},
        ("apple", "bread", "egg", "potato", "tomato", "lettuce", "mug", "cup", "plate", "bowl", "pan", "pot",
         "fork", "knife", "spoon", "spatula", "kettle", "dishsponge", "saltshaker", "winebottle"),
    ),
    "livingroom": Scene(
        "livingroom",
        {"sofa": (1, 1), "coffeetable": (1, 1), "sidetable": (1, 2), "tvstand": (0, 1), "drawer": (1, 3),
         "cabinet": (0, 2), "shelf": (1, 2), "armchair": (0, 1), "garbagecan": (1, 1)},
        ("remotecontrol", "book", "newspaper", "keychain", "creditcard", "statue", "vase", "box", "pillow",
         "laptop", "watch", "bowl"),
    ),
    "bedroom": Scene(
        "bedroom",
        {"bed": (1, 1), "desk": (1, 1), "sidetable": (1, 2), "dresser": (1, 1), "drawer": (1, 4),
         "shelf": (1, 2), "safe": (0, 1), "garbagecan": (1, 1)},
        ("book", "cellphone", "alarmclock", "pen", "pencil", "laptop", "pillow", "creditcard", "keychain",
         "cd", "mug", "bowl"),
    ),
    "bathroom": Scene(
        "bathroom",
        {"countertop": (1, 1), "cabinet": (1, 4), "drawer": (0, 2), "sinkbasin": (1, 2), "shelf": (0, 2),
         "toilet": (1, 1), "towelholder": (1, 1), "bathtubbasin": (0, 1), "garbagecan": (1, 1)},
        ("soapbar", "cloth", "spraybottle", "candle", "toiletpaper", "soapbottle", "towel", "dishsponge"),
    ),
}  # fmt: skip
# Which scenes host each task type, and which objects a verb applies to (ALFWorld's own lists).
_TASK_SCENES = {
    "pick_and_place_simple": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "pick_two_obj_and_place": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "look_at_obj_in_light": ("livingroom", "bedroom"),
}
_VERB_OBJECTS = {
    "clean": {"apple", "bowl", "cup", "egg", "fork", "kettle", "knife", "lettuce", "mug", "pan", "plate", "pot",
              "potato", "spatula", "spoon", "tomato", "dishsponge", "soapbar", "cloth"},
    "heat": {"apple", "bread", "cup", "egg", "mug", "plate", "potato", "tomato"},
    "cool": {"apple", "bread", "cup", "egg", "lettuce", "mug", "pan", "plate", "pot", "potato", "tomato",
             "winebottle"},
    "light": {"alarmclock", "book", "bowl", "cd", "cellphone", "creditcard", "keychain", "laptop", "mug",
              "newspaper", "pen", "pencil", "pillow", "remotecontrol", "statue", "vase", "watch", "box"},
}  # fmt: skip
_VERB = {
    "pick_clean_then_place_in_recep": ("clean", "sinkbasin", "clean"),
    "pick_heat_then_place_in_recep": ("heat", "microwave", "hot"),
    "pick_cool_then_place_in_recep": ("cool", "fridge", "cool"),
}
# Where the goal's object may not start (it would be placed already) and where it may not go.
_NOT_A_DESTINATION = {"sinkbasin", "microwave", "garbagecan"}


@dataclass(frozen=True)
class Thing:
    """An object or receptacle of the game: its name (`apple 1`), kind (`apple`) and place."""

    name: str
    kind: str
    where: str | None = None  # the receptacle an object starts in/on; None for receptacles


@dataclass(frozen=True)
class Plan:
    """A household game before TextWorld builds it: drawn from the seed alone (see `plan`)."""

    task: str
    room: str
    receptacles: tuple[Thing, ...]
    objects: tuple[Thing, ...]
    target: str  # the object kind the goal names
    destination: str | None  # the receptacle kind it must end in/on (None: look_at_obj_in_light)
    goal: str  # ALFWorld's words: "put a hot apple in fridge."
    walkthrough: tuple[str, ...]

    def kind_of(self, name: str) -> str:
        """The kind of the receptacle called `name`."""
        return next(r.kind for r in self.receptacles if r.name == name)


def inside(kind: str) -> bool:
    """Whether things go in (a container) rather than on a receptacle of this kind."""
    return RECEPTACLES[kind] in ("c", "cooler", "heater", "open")


def closed_at_start(kind: str) -> bool:
    """Whether a receptacle of this kind must be opened before anything goes in or comes out."""
    return RECEPTACLES[kind] in ("c", "cooler", "heater")


def plan(task: str | None, distractors: int, seed: int) -> Plan:
    """The game of `task` (None: one of the six, drawn from the seed) for game seed `seed`."""
    rng = random.Random(f"arle-household:{seed}")
    task = task or rng.choice(TASKS)
    scene = SCENES[rng.choice(_TASK_SCENES[task])]
    receptacles: list[Thing] = []
    for kind, (lo, hi) in scene.receptacles.items():
        receptacles += [Thing(f"{kind} {i}", kind) for i in range(1, rng.randint(lo, hi) + 1)]
    verb = _VERB.get(task)
    kinds = [k for k in scene.objects if verb is None or k in _VERB_OBJECTS[verb[0]]]
    if task == "look_at_obj_in_light":
        kinds = [k for k in kinds if k in _VERB_OBJECTS["light"]]
    target = rng.choice(kinds)
    dest_kinds = sorted({r.kind for r in receptacles} - _NOT_A_DESTINATION)
    destination = None if task == "look_at_obj_in_light" else rng.choice(dest_kinds)
    starts = [r.name for r in receptacles if r.kind != destination and r.kind not in ("microwave",)]
    count = 2 if task == "pick_two_obj_and_place" else rng.randint(1, 2)
    objects = [Thing(f"{target} {i}", target, rng.choice(starts)) for i in range(1, count + 1)]
    others = [k for k in scene.objects if k != target]
    for kind in rng.sample(others, min(distractors, len(others))):
        objects.append(Thing(f"{kind} 1", kind, rng.choice([r.name for r in receptacles])))
    where = "in" if destination is not None and inside(destination) else "on"
    if task == "pick_two_obj_and_place":
        goal = f"put two {target} {where} {destination}."
    elif task == "look_at_obj_in_light":
        goal = f"look at {target} under the desklamp."
    elif verb is not None:
        goal = f"put a {verb[2]} {target} {where} {destination}."
    else:
        goal = f"put a {target} {where} {destination}."
    recs = tuple(receptacles)
    walk = _walkthrough(task, recs, tuple(objects), target, destination, verb)
    return Plan(task, scene.room, recs, tuple(objects), target, destination, goal, walk)


def _walkthrough(
    task: str,
    receptacles: tuple[Thing, ...],
    objects: tuple[Thing, ...],
    target: str,
    destination: str | None,
    verb: tuple[str, str, str] | None,
) -> tuple[str, ...]:
    """Open what hides each goal object, take it, apply the verb, open the first destination and
    put it there; for the light task, take the object and use the lamp."""
    kind = {r.name: r.kind for r in receptacles}
    opened: set[str] = set()
    steps: list[str] = []

    def open_(name: str) -> None:
        if closed_at_start(kind[name]) and name not in opened:
            steps.append(f"open {name}")
            opened.add(name)

    wanted = [o for o in objects if o.kind == target][: 2 if task == "pick_two_obj_and_place" else 1]
    goal_place = None if destination is None else next(r.name for r in receptacles if r.kind == destination)
    for obj in wanted:
        assert obj.where is not None
        open_(obj.where)
        steps.append(f"take {obj.name} from {obj.where}")
        if task == "look_at_obj_in_light":
            steps.append("use desklamp 1")
            continue
        if verb is not None:
            appliance = next(r.name for r in receptacles if r.kind == verb[1])
            steps.append(f"{verb[0]} {obj.name} with {appliance}")
        assert goal_place is not None
        open_(goal_place)
        put = "insert {} into {}" if inside(kind[goal_place]) else "put {} on {}"
        steps.append(put.format(obj.name, goal_place))
    return tuple(steps)


# TextWorld -------------------------------------------------------------------------------


DATA = Path(__file__).resolve().parent / "household_data"


@functools.lru_cache(maxsize=1)
def knowledge_base() -> Any:
    """TextWorld's own logic with household.twl added, and the grammar tags for its verbs."""
    data = importlib.import_module("textworld.generator.data")
    logic = importlib.import_module("textworld.logic")
    paths = sorted(glob.glob(os.path.join(data.LOGIC_DATA_PATH, "*.twl"))) + [str(DATA / "household.twl")]
    return data.KnowledgeBase(logic.GameLogic.load(paths), str(DATA))


def make(settings: dict[str, Any], options: Any, *, seed: int) -> Any:
    """The textworld.Game of a `household` game spec (settings task and distractors, game seed
    `seed`; `options` carries TextWorld's seeds for its text), its walkthrough checked against
    TextWorld's logic."""
    tw = importlib.import_module("textworld")
    game_mod = importlib.import_module("textworld.generator.game")
    layout = plan(settings.get("task"), int(settings.get("distractors", 4)), seed)
    options.kb = knowledge_base()
    maker = tw.GameMaker(options)
    room = maker.new_room(layout.room)
    maker.set_player(room)
    made: dict[str, Any] = {}
    for rec in layout.receptacles:
        typ = RECEPTACLES[rec.kind]
        made[rec.name] = maker.new(type="c" if typ == "open" else typ, name=rec.name)
        room.add(made[rec.name])
        if inside(rec.kind):
            made[rec.name].add_property("closed" if closed_at_start(rec.kind) else "open")
    if layout.task == "look_at_obj_in_light":
        lamp = maker.new(type="lamp", name="desklamp 1")
        room.add(lamp)
        lamp.add_property("unlit")
    for obj in layout.objects:
        made[obj.name] = maker.new(type="o", name=obj.name)
        assert obj.where is not None
        made[obj.where].add(made[obj.name])
    actions = _actions(maker, layout.walkthrough)
    events = [
        game_mod.Event(actions=actions if i == 0 else (), conditions=conditions)
        for i, conditions in enumerate(_win_conditions(maker, layout, made))
    ]
    objective = f"Your task is to: {layout.goal}"
    maker.quests = [game_mod.Quest(win_events=events, desc=objective)]
    game = maker.build()
    game.objective = objective
    game.metadata["walkthrough"] = list(layout.walkthrough)
    game.metadata["arle_household"] = {"task": layout.task, "room": layout.room, "goal": layout.goal}
    return game


def _win_conditions(maker: Any, layout: Plan, made: dict[str, Any]) -> list[list[Any]]:
    """One condition set per way to win: any object of the target kind (any pair, for two) in/on
    any receptacle of the destination kind, with the verb's property; or held under the lamp."""
    targets = [made[o.name] for o in layout.objects if o.kind == layout.target]
    if layout.task == "look_at_obj_in_light":
        [lamp] = maker.findall("lamp")
        return [[maker.new_fact("in", t, maker.inventory), maker.new_fact("lit", lamp)] for t in targets]
    places = [made[r.name] for r in layout.receptacles if r.kind == layout.destination]
    assert layout.destination is not None
    relation = "in" if inside(layout.destination) else "on"
    verb = _VERB.get(layout.task)
    two = layout.task == "pick_two_obj_and_place"
    groups = list(itertools.combinations(targets, 2)) if two else [(t,) for t in targets]
    out = []
    for group, place in itertools.product(groups, places):
        facts = [maker.new_fact(relation, t, place) for t in group]
        if verb is not None:
            facts += [maker.new_fact(verb[2], t) for t in group]
        out.append(facts)
    return out


def _actions(maker: Any, commands: tuple[str, ...]) -> list[Any]:
    """TextWorld's actions for the walkthrough's commands, applied in order to the game's start
    state; a command its logic does not admit is a bug in `plan`, refused here."""
    kb = knowledge_base()
    state = maker.state.copy()
    names = {e.id: e.name for e in maker._entities.values()}
    actions = []
    for command in commands:
        for action in state.all_applicable_actions(kb.rules.values(), kb.types.constants_mapping):
            if action.format_command(names) == command:
                break
        else:
            raise UserError(f"textworld household: the walkthrough's '{command}' is not admitted (a bug in arle)")
        state.apply(action)
        actions.append(action)
    return actions
