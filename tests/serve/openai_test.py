# SPDX-License-Identifier: Apache-2.0
"""`dgemma serve` through the official openai client (docs/serving.md): chat, completions,
streaming, the dgemma extension via extra_body, and errors raised as the client's exception types.
    openai_test.py BASE_URL API_KEY MODEL_ID"""
import sys
import unittest

import openai

BASE_URL, API_KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
del sys.argv[1:]


class OpenAIClient(unittest.TestCase):
    def setUp(self):
        self.client = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=60)

    def chat(self, content="Add: 417 + 385", **kw):
        return self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)

    def test_models(self):
        ids = [m.id for m in self.client.models.list()]
        self.assertEqual(ids, [MODEL])

    def test_chat(self):
        r = self.chat(seed=7)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].message.content, "802")
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertEqual(self.chat(seed=7).choices[0].message.content, r.choices[0].message.content)

    def test_completion(self):
        r = self.client.completions.create(model=MODEL, prompt="Sort ascending: 93 44 60 89 20", max_tokens=20, seed=3)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 20)
        self.assertTrue(r.choices[0].text)

    def test_completion_list_of_prompts(self):
        prompts = ["Sort ascending: 93 44 60 89 20", "Reverse: abc", [2, 17, 5, 9]]
        r = self.client.completions.create(model=MODEL, prompt=prompts, max_tokens=16, seed=4)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        for i, p in enumerate(prompts):
            alone = self.client.completions.create(model=MODEL, prompt=p, max_tokens=16, seed=4)
            self.assertEqual(r.choices[i].text, alone.choices[0].text)
            self.assertEqual(r.choices[i].finish_reason, alone.choices[0].finish_reason)

    def test_n_choices(self):
        # Choice j is the answer with seed + j: several samples of one conversation.
        r = self.chat("Reverse: cat, moon, ship, blue", seed=20, n=3)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        for j in range(3):
            alone = self.chat("Reverse: cat, moon, ship, blue", seed=20 + j)
            self.assertEqual(r.choices[j].message.content, alone.choices[0].message.content)
        self.assertEqual(r.usage.prompt_tokens, alone.usage.prompt_tokens)  # the prompt counts once

    def test_stream_equals_whole(self):
        whole = self.chat("Reverse: cat, moon, ship, blue", seed=11).choices[0].message.content
        chunks = list(self.chat("Reverse: cat, moon, ship, blue", seed=11, stream=True,
                                stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole)
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finals, ["stop"])
        self.assertIsNotNone(chunks[-1].usage)
        # Reported once: clients that add up every chunk's usage (LangChain) must not count it twice.
        self.assertEqual(sum(1 for c in chunks if c.usage is not None), 1)

    def test_defaults_of_other_clients(self):
        # What LangChain, llama-index and others send by default (a temperature, top_p) is accepted
        # without effect and named in X-Dgemma-Ignored; the answer is the one without them.
        plain = self.chat(seed=7).choices[0].message.content
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Add: 417 + 385"}], seed=7, temperature=0.1, top_p=0.95)
        self.assertEqual(raw.parse().choices[0].message.content, plain)
        self.assertEqual(raw.headers.get("x-dgemma-ignored"), "temperature, top_p")
        # A conversation that hands the SDK's own message object back.
        first = self.chat("Add: 1 + 2", seed=7).choices[0].message
        again = self.client.chat.completions.create(
            model=MODEL, seed=7,
            messages=[{"role": "user", "content": "Add: 1 + 2"}, first.model_dump(),
                      {"role": "user", "content": "Add: 417 + 385"}])
        self.assertEqual(again.choices[0].finish_reason, "stop")

    def test_drafts_are_not_content(self):
        whole = self.chat(seed=5).choices[0].message.content
        chunks = list(self.chat(seed=5, stream=True, extra_body={"dgemma": {"stream_drafts": True}}))
        drafts = [c for c in chunks if (c.model_extra or {}).get("dgemma", {}).get("draft")]
        self.assertGreater(len(drafts), 0)
        for c in drafts:
            self.assertIsNone(c.choices[0].delta.content)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), whole)

    def test_stop_sequence(self):
        r = self.client.completions.create(model=MODEL, prompt="Sort ascending: 93 44 60 89 20", max_tokens=48,
                                           seed=3, stop=[" 60"])
        self.assertNotIn(" 60", r.choices[0].text)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_errors(self):
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(e.exception.code, "model_not_found")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(temperature=3)
        self.assertEqual(e.exception.param, "temperature")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(response_format={"type": "json_object"})
        self.assertEqual(e.exception.param, "response_format")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(max_tokens=0)
        self.assertEqual(e.exception.param, "max_tokens")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(n=0)
        self.assertEqual(e.exception.param, "n")
        with self.assertRaises(openai.BadRequestError) as e:
            self.chat(extra_body={"dgemma": {"t_min": "low"}})
        self.assertEqual(e.exception.param, "dgemma.t_min")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=MODEL, prompt="one two " * 300)
        self.assertEqual(e.exception.code, "context_length_exceeded")
        bad = openai.OpenAI(base_url=BASE_URL, api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()


if __name__ == "__main__":
    unittest.main(verbosity=2)
