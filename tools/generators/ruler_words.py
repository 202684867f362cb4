"""Plain English nouns: the keys of the needles and the vocabulary of the common-words lists."""

from __future__ import annotations

NOUNS = (
    "anchor", "apple", "apron", "arrow", "attic", "badge", "bagel", "banner", "barrel", "basket",
    "beacon", "bell", "bench", "berry", "blanket", "boat", "bonnet", "bottle", "bracelet", "branch",
    "bread", "brick", "bridge", "broom", "bucket", "button", "cabin", "cable", "camel", "candle",
    "canoe", "canvas", "carpet", "carrot", "castle", "cellar", "chair", "chalk", "cherry", "chimney",
    "circle", "clock", "cloud", "coat", "coffee", "comet", "copper", "corner", "cotton", "cradle",
    "crayon", "cricket", "crown", "cushion", "daisy", "desert", "diamond", "dinner", "doctor",
    "dolphin", "donkey", "dragon", "drawer", "drum", "eagle", "engine", "falcon", "feather", "fence",
    "ferry", "fiddle", "finger", "forest", "fountain", "garden", "garlic", "ginger", "glacier",
    "glove", "goat", "guitar", "hammer", "harbor", "helmet", "honey", "horse", "island", "jacket",
    "jelly", "jewel", "kettle", "kitten", "ladder", "lantern", "lemon", "letter", "library", "lily",
    "lion", "lobster", "locket", "magnet", "mango", "maple", "marble", "meadow", "melon", "mirror",
    "mitten", "monkey", "mountain", "muffin", "napkin", "needle", "nest", "oak", "ocean", "olive",
    "onion", "orange", "orchard", "otter", "oven", "owl", "paddle", "palace", "panda", "parrot",
    "peach", "pebble", "pencil", "pepper", "piano", "pickle", "pillow", "pirate", "planet", "plum",
    "pocket", "pony", "potato", "pumpkin", "puzzle", "quilt", "rabbit", "radio", "raft", "rainbow",
    "raven", "ribbon", "river", "robot", "rocket", "saddle", "sail", "salmon", "sandal", "saucer",
    "scarf", "shadow", "sheep", "shell", "shovel", "silver", "sketch", "sled", "spoon", "squirrel",
    "stable", "statue", "stone", "strawberry", "sugar", "sunset", "swan", "sweater", "table",
    "teapot", "temple", "thimble", "thunder", "tiger", "timber", "toast", "tomato", "torch", "tower",
    "tractor", "trumpet", "tulip", "tunnel", "turtle", "umbrella", "valley", "velvet", "village",
    "violin", "wagon", "walnut", "wheel", "whistle", "window", "wizard", "wolf", "yacht", "zebra",
)
