"""What `llamafast eval` offers, as data without torch (its --help lists them): the built-in prompts whose sampled
continuations make the quality stream when no --text is given, and the weight variants it compares."""

PROMPTS = [
    "The history of the city began", "def parse_config(path):", "In this paper we show that",
    "Once upon a time, in a small village,", "The recipe calls for", "Dear team, thank you for",
    "The weather tomorrow will be", "Photosynthesis is the process by which",
]

VARIANTS = ("fp8_e5m2", "fp8_e4m3", "q8_0", "q4_0", "q4_1", "bfloat16", "float16", "float32")
