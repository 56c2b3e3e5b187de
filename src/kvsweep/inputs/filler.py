"""Filler text for long prompts: plain descriptive prose, generated from a seed, sentence by sentence.

Retrieval in a long context is a test only when the text around the needle is varied (one sentence repeated makes
attention trivial and hides what a lossy cache does) and nothing in it could pass for the answer or the question's
subject. Real text fails the second: the first filler, docstrings of Python's standard library, is about code,
keys and passing values, and a real chat model asked for "the pass key" after it answered about the text instead.
So the filler is kvsweep's own (Apache-2.0): scenes of country life, each sentence a template (`TOPICS`) filled
from word lists (`filler_words.py`) with no digits and nothing about passing, keys, locks, secrets, codes or
computing (`FORBIDDEN_WORDS`, checked by the tests). Nothing is read or downloaded: paragraph `n` is the same
everywhere.
"""

import functools
import random
import re

from kvsweep.inputs.filler_words import OPENERS, WORDS

TOPICS: tuple[tuple[str, ...], ...] = (
    (  # weather and sky
        "{time}, {sky} hung over {place}.",
        "The air smelled of wet earth and {plant}.",
        "{Person} looked up at the sky and said it would change before evening.",
        "Shadows moved across {place} as the clouds went by.",
        "The light turned {colour} and then faded.",
        "Nobody could say whether the weather would hold until the end of the week.",
        "A wind came up from the valley and shook {plant}.",
        "By the time the lamps were lit, {sky} had settled over the rooftops.",
        "The puddles in the lane reflected {sky}.",
        "{Animal} sheltered under {thing} until it was over.",
    ),
    (  # the river
        "The river ran high after the spring rains.",
        "{Person} {verb_move} the water and watched {animal} on the far bank.",
        "The current carried leaves and twigs down towards {place}.",
        "Along the bank, {plant} leaned over the water.",
        "{Sound} carried across the water in the still air.",
        "{Animal} waded into the shallows and stood quite still.",
        "A little boat was tied up below the willows, its paint {colour} and peeling.",
        "The water was clear enough to see the stones on the bottom.",
        "In summer the children swam where the river slowed and widened.",
        "Mist rose from the surface at dawn and lay along the banks until the sun was up.",
    ),
    (  # the garden
        "{Person} spent the morning in {place}.",
        "The beds were full of {plant}, and the paths were edged with lavender.",
        "Weeds came up faster than anyone could pull them out.",
        "{Animal} hopped along the wall looking for worms.",
        "The soil was dark and soft after the rain.",
        "By the gate stood {thing}, half covered in ivy.",
        "In the corner, {plant} grew taller every year.",
        "{Person} cut flowers for the kitchen table and carried them in a basket.",
        "The smell of {plant} filled the warm afternoon.",
        "Every evening the beds were watered from the well.",
    ),
    (  # the market
        "{Time}, {place} filled with carts and stalls.",
        "{Person} sold {food} from a trestle table under an awning.",
        "Farmers came in from the hills with sheep and geese.",
        "The smell of {food} drifted between the stalls.",
        "{Sound} rose above the talk of the crowd.",
        "Prices were argued over, and most of the arguments ended in laughter.",
        "{Person} bought {food} and a length of {colour} ribbon.",
        "By noon the best of the fruit was gone.",
        "Children ran between the stalls, chased by {animal}.",
        "When the stalls were packed away, the square was swept and quiet again.",
    ),
    (  # the kitchen
        "The kitchen was the warmest room in the house.",
        "{Person} set {food} on the table by the window.",
        "A kettle sang on the range, and the windows were misted over.",
        "Bunches of herbs hung drying from the beams.",
        "The table was scrubbed pale from years of use.",
        "There was always {food} for anyone who came in from the cold.",
        "{Animal} slept by the stove, one ear turned towards the door of the pantry.",
        "The smell of {food} reached the yard outside.",
        "Plates and bowls of {colour} glaze stood on the dresser.",
        "In the evening the family sat there and talked over the day.",
    ),
    (  # birds and animals
        "{Animal} came every morning to {place}.",
        "{Person} stopped to watch {animal} in the hedge.",
        "The birds were busy building nests among {plant}.",
        "At dusk {animal} crossed the field towards the wood.",
        "{Sound} could be heard from the edge of the heath.",
        "In the autumn the swallows gathered on the roof before leaving.",
        "A family of ducks lived on the mill pond and followed anyone with bread.",
        "{Animal} sat on {thing} and looked about as if it owned the place.",
        "The farm dogs knew every sheep by sight.",
        "Owls called to each other across the valley after dark.",
    ),
    (  # the road and travellers
        "{Person} set out along the road that climbed out of the valley.",
        "The road wound between {plant} and fields of {colour} grain.",
        "{Time}, the road was empty except for {animal}.",
        "At the crossroads stood {thing} and a signpost worn smooth by the weather.",
        "Travellers stopped at the inn to rest their horses and eat {food}.",
        "From the top of the hill the whole valley could be seen, with {place} below.",
        "The walk took most of the day, and the traveller arrived {feeling}.",
        "Dust rose behind every cart in the dry weeks of summer.",
        "{Person} met {person} on the way and they walked on together.",
        "Along the verges grew {plant} and tall grasses.",
    ),
    (  # seasons and farm work
        "{Time}, there was always more work than daylight.",
        "The fields were ploughed and the furrows lay {colour} in the low sun.",
        "{Person} brought the cows in from {place} for milking.",
        "The hay was cut, turned and stacked before the weather broke.",
        "Apples were picked and laid out in rows in the loft.",
        "{Sound} marked the beginning and the end of each working day.",
        "In winter the animals were kept in the barn and fed on hay.",
        "{Person} mended the fences while {animal} watched.",
        "When the barley was ripe, the whole village helped to bring it in.",
        "Everyone was {feeling} when the last cart came home.",
    ),
    (  # the village evening
        "As the evening drew in, lamps were lit in the windows along {place}.",
        "{Person} sat on a bench outside the inn, {feeling}.",
        "{Sound} faded as the light went.",
        "Smoke rose straight up from the chimneys in the still air.",
        "Neighbours stopped at their gates to talk about the weather and the crops.",
        "The church clock struck, and somewhere a door closed.",
        "{Animal} settled down for the night under {thing}.",
        "Stars came out one by one above the rooftops.",
        "The last light lay {colour} over {place}.",
        "Soon the whole village was asleep.",
    ),
    (  # the woods
        "The beech wood was cool even in the heat of summer.",
        "Sunlight came down through the leaves in {colour} patches.",
        "{Person} gathered kindling and mushrooms along the path.",
        "The ground was soft with the leaves of many autumns.",
        "{Animal} moved somewhere among {plant}, unseen.",
        "An old track led through the trees to a clearing where charcoal had once been burned.",
        "In spring the floor of the wood was blue with flowers.",
        "{Sound} seemed far away under the trees.",
        "Woodcutters had left a pile of logs beside the path to season.",
        "At the edge of the wood the fields opened out again, bright after the shade.",
    ),
    (  # the mill
        "The mill stood where {place} bent towards the road.",
        "{Person} had worked the mill for as long as anyone could recall.",
        "Sacks of flour were stacked against {thing}, white with dust.",
        "{Sound} went on from morning until dusk.",
        "Farmers brought their grain in carts and waited their turn by {thing}.",
        "{Animal} lived in the rafters and kept the mice away.",
        "In a dry summer the stream ran low and the wheel stood still for days.",
        "The flour was {colour} and fine, and the bakers of three villages bought it.",
        "{Person} sat on the step at noon and ate {food}.",
        "When the light failed, the sluice was closed and the wheel slowed and stopped.",
    ),
    (  # the inn
        "The inn stood at the corner of {place}, with a painted sign above its porch.",
        "{Person} kept a fire burning in the hearth all winter.",
        "Travellers sat at the long table and ate {food}.",
        "{Sound} came in through the open windows on summer evenings.",
        "The floorboards were worn smooth and the beams were black with smoke.",
        "{Person} and {person} argued cheerfully about the weather.",
        "{Animal} slept in the yard behind the stables.",
        "On fair days the benches outside were full until late.",
        "Lamplight fell {colour} across the cobbles of the yard.",
        "Every guest left {feeling}, or so the landlady liked to say.",
    ),
    (  # children and school
        "The school was a single room with tall windows facing {place}.",
        "{Person} taught the children to read and to draw maps of the valley.",
        "At playtime the children ran down to {place}.",
        "They came back with muddy boots and pockets full of acorns.",
        "{Animal} sometimes wandered up to the schoolroom window.",
        "In winter the stove was lit before the first child arrived.",
        "Lessons ended early on the day of the harvest supper.",
        "{Person} walked the youngest ones home along {place}.",
        "The children sang as they went, {feeling}.",
        "Their drawings of {plant} were pinned along the schoolroom wall.",
    ),
    (  # the harbour and the sea
        "The fishing boats came in on the evening tide.",
        "{Person} mended nets on the quay, {feeling}.",
        "Gulls wheeled over {place} crying for scraps.",
        "The smell of salt and tar hung over the harbour.",
        "{Time}, the sea was {colour} and calm.",
        "Ropes creaked as the boats rose and fell against the wall.",
        "Baskets of fish were carried up the steps to the market.",
        "Far out, a sail showed white against {sky}.",
        "Old men sat on the harbour wall and watched the weather.",
        "When a storm came, the boats stayed in and the whole town waited.",
    ),
)


FORBIDDEN_WORDS = frozenset(
    {
        "pass", "passed", "passing", "passes", "password", "passkey", "key", "keys", "lock", "locked",
        "code", "codes", "secret", "secrets", "hidden", "hide", "remember", "number", "numbers", "digit",
        "digits", "program", "computer", "function", "answer", "question",
    }
)  # fmt: skip
PARAGRAPHS = 1_000_003  # how many distinct paragraphs a prompt may start from (any index works)
SENTENCES = (4, 8)  # fewest and most sentences in a paragraph

OPENER_SHARE = 0.35  # of sentences that get one of `OPENERS` before them
OPENED = (*WORDS["time"], "In ", "At ", "As ", "By ", "When ", "From ", "Along ", "Far out", "On ")


@functools.cache
def paragraph(index: int) -> tuple[str, ...]:
    """The `index`-th paragraph of the filler, as its sentences: the same on every machine."""
    rng = random.Random(f"kvsweep-filler:{index}")
    templates = rng.choice(TOPICS)
    count = rng.randint(*SENTENCES)
    picked = rng.sample(templates, min(count, len(templates)))
    return tuple(_opened(_fill(template, rng), rng) for template in picked)


def _opened(sentence: str, rng: random.Random) -> str:
    """Now and then an opener before the sentence, unless it opens with a phrase of its own already."""
    if rng.random() >= OPENER_SHARE or sentence.startswith(OPENED):
        return sentence
    return f"{rng.choice(OPENERS)}, {sentence[0].lower()}{sentence[1:]}"


SLOT = re.compile(r"\{(\w+)\}")


def _fill(template: str, rng: random.Random) -> str:
    def word(match: re.Match[str]) -> str:
        slot = match.group(1)
        chosen = rng.choice(WORDS[slot.lower()])
        return chosen[0].upper() + chosen[1:] if slot[0].isupper() else chosen

    return SLOT.sub(word, template)
