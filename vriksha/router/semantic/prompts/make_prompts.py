"""Writes train.jsonl and heldout.jsonl: labelled prompts over five intents for the classifier head.

Each intent has templates and slot values in two disjoint halves (train / held-out) plus hand-written
prompts per split, so no held-out prompt is a train template with other words in the slots. Deterministic:
`python -m vriksha.router.semantic.prompts.make_prompts` rewrites the same files."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

# intent -> split -> (templates, slot values, hand-written prompts)
T: dict[str, dict[str, tuple[list[str], list[str], list[str]]]] = {
    "chitchat": {
        "train": (
            [
                "hey, how is your {x} going?",
                "{x}! what's up with you today?",
                "just wanted to say {x}",
                "I'm bored, tell me something about your {x}",
                "do you like {x}?",
                "haha that was {x}",
            ],
            [
                "day",
                "weekend",
                "good morning",
                "hello there",
                "music",
                "rainy days",
                "pretty funny",
                "evening",
            ],
            [
                "hi!",
                "how are you doing?",
                "thanks, you're the best",
                "good night, talk tomorrow",
                "lol ok",
                "what's your favourite colour?",
                "I had a long day at work",
                "nice to meet you",
                "you're funny",
                "do you ever get tired?",
                "I'm feeling a bit down today",
                "yo",
                "can we just chat for a bit?",
                "what did you do today?",
                "cheers mate",
                "see you later",
            ],
        ),
        "heldout": (
            ["{x} :) anything fun planned?", "ugh, {x}. cheer me up?", "honestly {x}, how about you?"],
            ["mondays", "happy friday", "I'm so tired", "just got back from holiday", "feeling great"],
            [
                "hello hello",
                "what's new with you?",
                "you made my day",
                "I can't sleep, wanna talk?",
                "do you have a name?",
                "how's life treating you",
                "sup",
                "good afternoon!",
                "that's hilarious",
                "missed talking to you",
                "are you having a good day?",
                "bye for now",
                "tell me a fun fact about yourself",
                "I just adopted a puppy!",
                "weather's lovely today, isn't it",
            ],
        ),
    },
    "math": {
        "train": (
            [
                "What is {x}?",
                "Compute {x} and show the steps.",
                "Solve for x: {x}",
                "Can you evaluate {x} for me?",
                "Prove that {x}.",
                "Find the derivative of {x}.",
            ],
            [
                "17 * 23",
                "the integral of x^2 from 0 to 3",
                "2x + 5 = 17",
                "sqrt(144) + 3^4",
                "the sum of the first 100 integers is 5050",
                "sin(x) * cos(x)",
                "x^2 - 5x + 6 = 0",
                "log2(1024)",
            ],
            [
                "How many ways can 5 people sit around a round table?",
                "Is 391 a prime number?",
                "What is the probability of rolling two sixes with two dice?",
                "Factor 84 into primes",
                "A train travels 120 km in 1.5 hours; what is its average speed?",
                "What is 15% of 240?",
                "Convert 0.375 to a fraction",
                "What's the area of a circle with radius 7?",
                "Find the eigenvalues of [[2, 1], [1, 2]]",
                "Simplify (a^2 - b^2) / (a - b)",
                "what's the lcm of 12 and 18",
                "Determine the limit of (1 + 1/n)^n as n goes to infinity",
                "Expand (x + 2)^3",
                "If f(x) = 3x - 4, what is f(f(2))?",
                "Calculate 7 factorial",
                "Show that the square root of 2 is irrational",
            ],
        ),
        "heldout": (
            ["quick maths question: {x}", "I'm stuck on my homework, {x}", "help me work out {x}"],
            [
                "what is 48 divided by 6 plus 13",
                "solve 3y - 7 = 11",
                "differentiate e^(2x)",
                "integrate 1/x dx",
                "what is 12 cubed",
            ],
            [
                "How many diagonals does a hexagon have?",
                "What's the median of 3, 9, 4, 7, 12?",
                "A rectangle has perimeter 30 and width 5. What is its area?",
                "Is 2^31 - 1 prime?",
                "What is the GCD of 252 and 105?",
                "Compute the determinant of [[1, 2], [3, 4]]",
                "If I invest 1000 at 5% compound interest for 3 years, what do I get?",
                "Find x if 2^x = 64",
                "What is the expected value of a fair six-sided die?",
                "Sum the geometric series 1 + 1/2 + 1/4 + ...",
                "How many primes are there below 50?",
                "Convert 101101 from binary to decimal",
                "what's 3/8 + 5/12",
                "Prove by induction that n^3 - n is divisible by 6",
            ],
        ),
    },
    "code": {
        "train": (
            [
                "Write a {x} function that reverses a linked list",
                "How do I {x} in Python?",
                "Fix this bug: {x}",
                "What does this code do? {x}",
                "Refactor my {x} to be cleaner",
                "Explain the difference between {x} in programming",
            ],
            [
                "Python",
                "read a CSV file",
                "TypeError: 'NoneType' object is not subscriptable",
                "for i in range(10): print(i)",
                "JavaScript promise chain",
                "list and tuple",
                "merge two dictionaries",
                "Rust",
            ],
            [
                "Write a SQL query that returns the top 5 customers by revenue",
                "My React component re-renders forever, why?",
                "How do I undo the last git commit?",
                "Implement binary search in Go",
                "What is a segmentation fault in C?",
                "Write a bash one-liner to count lines in all .py files",
                "def f(x): return x if x < 2 else f(x-1) + f(x-2)  -- make this faster",
                "How do I make an HTTP request with requests and a timeout?",
                "Explain async/await in JavaScript with an example",
                "Write a regex that matches an ISO date",
                "Why does my Docker container exit immediately?",
                "Convert this loop to a list comprehension",
                "How do I set up a virtual environment with pip?",
                "Write unit tests for a function that adds two numbers",
                "What's the time complexity of quicksort?",
                "Dockerfile for a FastAPI app please",
            ],
        ),
        "heldout": (
            [
                "In {x}, how can I sort an array of objects by a key?",
                "code review please: {x}",
                "my program crashes with {x}, any idea?",
            ],
            [
                "TypeScript",
                "Java",
                "KeyError: 'id'",
                "IndexError: list index out of range",
                "const x = await fetch(url).json()",
            ],
            [
                "Write a function to check if a string is a palindrome",
                "How do I squash commits in git rebase?",
                "Implement an LRU cache class",
                "Why is my pandas groupby so slow?",
                "What is the difference between a process and a thread?",
                "Write a Makefile target that runs pytest",
                "How do I read environment variables in Node?",
                "Generate a Python dataclass for a user with name and email",
                "Explain what a closure is in Python",
                "How do I parse JSON in C#?",
                "kubectl says CrashLoopBackOff, how do I debug it?",
                "write a C++ template for a max function",
                "What's the idiomatic way to handle errors in Rust?",
                "Turn this callback code into async/await",
            ],
        ),
    },
    "writing": {
        "train": (
            [
                "Summarize this article in three sentences: {x}",
                "Write a short poem about {x}",
                "Draft an email to my boss about {x}",
                "Rewrite this paragraph to sound more formal: {x}",
                "Give me a catchy title for a blog post on {x}",
                "Write a cover letter for {x}",
            ],
            [
                "remote work",
                "the ocean at night",
                "taking Friday off",
                "a junior data analyst role",
                "climate change and cities",
                "our team's quarterly results",
                "autumn leaves",
                "the new product launch",
            ],
            [
                "Proofread my essay intro: 'In todays world technology are everywhere.'",
                "Write a wedding toast for my sister",
                "Summarize the plot of Hamlet in a paragraph",
                "Make this tweet funnier: 'Mondays are hard'",
                "Write a product description for noise-cancelling headphones",
                "Condense these meeting notes into bullet points",
                "Write a haiku about coffee",
                "Help me write a polite complaint letter to my landlord",
                "Paraphrase: 'The results were inconclusive.'",
                "Give me an outline for a persuasive essay on school uniforms",
                "Write a bedtime story about a brave turtle",
                "Translate the tone of this message to be friendlier",
                "TL;DR this: the committee met and postponed the vote",
                "Write a LinkedIn post announcing my new job",
                "Suggest three taglines for a bakery",
                "Write the opening line of a mystery novel",
            ],
        ),
        "heldout": (
            [
                "Can you make a limerick about {x}?",
                "I need a two-paragraph summary of {x}",
                "Compose a thank-you note regarding {x}",
            ],
            [
                "my cat",
                "the French Revolution",
                "a colleague's retirement",
                "a rainy train journey",
                "the history of the internet",
            ],
            [
                "Edit this for clarity: 'Due to the fact that we was late, the meeting it got moved.'",
                "Write a short speech for a school graduation",
                "Give me a summary of the book 1984",
                "Draft a resignation letter that stays on good terms",
                "Write song lyrics about summer love",
                "Shorten this abstract to 50 words",
                "Write a eulogy for my grandfather who loved fishing",
                "Brainstorm names for a fantasy kingdom",
                "rewrite my bio so it sounds professional",
                "Write an apology message to a friend I forgot to call",
                "Create a slogan for a recycling campaign",
                "Write a fairy tale opening set in a city of glass",
                "Summarize the key points of this memo for executives",
                "Write a sonnet about the moon",
            ],
        ),
    },
    "factual": {
        "train": (
            [
                "Who was {x}?",
                "When did {x} happen?",
                "What is the capital of {x}?",
                "Tell me about {x}.",
                "Where is {x} located?",
                "Why is {x}?",
            ],
            [
                "Marie Curie",
                "the fall of the Berlin Wall",
                "Australia",
                "the Great Barrier Reef",
                "the sky blue",
                "Genghis Khan",
                "Machu Picchu",
                "the Treaty of Versailles",
            ],
            [
                "How tall is Mount Everest?",
                "What language is spoken in Brazil?",
                "Who painted the Mona Lisa?",
                "How many bones are in the human body?",
                "What causes the seasons on Earth?",
                "Which planet has the most moons?",
                "What is the boiling point of water at sea level?",
                "Who wrote Pride and Prejudice?",
                "What year did the first moon landing happen?",
                "What is photosynthesis?",
                "How long is the Nile river?",
                "What currency does Japan use?",
                "Who invented the telephone?",
                "What's the largest desert in the world?",
                "How do vaccines work?",
                "Which country has the largest population?",
            ],
        ),
        "heldout": (
            [
                "I've always wondered, what is {x}?",
                "quick question: who discovered {x}?",
                "Explain briefly the history of {x}",
            ],
            ["penicillin", "the Silk Road", "the speed of light", "the Roman Colosseum", "DNA's structure"],
            [
                "What is the smallest country in the world?",
                "When was the printing press invented?",
                "Which ocean is the deepest?",
                "Who was the first woman to win a Nobel Prize?",
                "How many time zones does Russia have?",
                "What is the chemical symbol for gold?",
                "Why do cats purr?",
                "What's the population of Canada roughly?",
                "Where do kangaroos live in the wild?",
                "What were the causes of World War I?",
                "How hot is the surface of the sun?",
                "Who composed the Four Seasons?",
                "What is the tallest building in the world?",
                "What does the mitochondria do in a cell?",
            ],
        ),
    },
}


def build(split: str, seed: int = 19) -> list[dict[str, str]]:
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for label, parts in T.items():
        templates, values, hand = parts[split]
        combos = [t.format(x=v) for t, v in itertools.product(templates, values)]
        rng.shuffle(combos)
        keep = 40 if split == "train" else 12
        rows += [{"text": c, "label": label} for c in combos[:keep]]
        rows += [{"text": h, "label": label} for h in hand]
    rng.shuffle(rows)
    return rows


def main() -> None:
    for split in ("train", "heldout"):
        rows = build(split)
        with open(HERE / f"{split}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{split}: {len(rows)} prompts")


if __name__ == "__main__":
    main()
