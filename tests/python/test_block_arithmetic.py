"""Prefix arithmetic at block boundaries: how many tokens an engine may skip, and what the cluster's
leading run looks like for prompts one token either side of a block boundary."""

import unittest

import numpy as np

import kvtier
import kvtier_cluster
from kvtier.adapters.vllm import reusable_prompt_tokens

B = 16


class ReusableTokensTest(unittest.TestCase):
    def test_always_whole_blocks_and_never_the_last_prompt_token(self):
        for prompt_tokens in range(0, 6 * B + 2):
            for hit_blocks in range(0, 8):
                got = kvtier.reusable_tokens(hit_blocks, B, prompt_tokens)
                self.assertEqual(got % B, 0, (hit_blocks, prompt_tokens))
                self.assertLessEqual(got, max(prompt_tokens - 1, 0), (hit_blocks, prompt_tokens))
                self.assertLessEqual(got, hit_blocks * B)
                # Maximal: one more block would break a rule.
                more = got + B
                self.assertTrue(more > hit_blocks * B or more > prompt_tokens - 1, (hit_blocks, prompt_tokens))

    def test_boundaries(self):
        self.assertEqual(kvtier.reusable_tokens(4, B, 4 * B), 3 * B)  # fully cached: last block recomputed
        self.assertEqual(kvtier.reusable_tokens(4, B, 4 * B + 1), 4 * B)
        self.assertEqual(kvtier.reusable_tokens(4, B, 4 * B - 1), 3 * B)
        self.assertEqual(kvtier.reusable_tokens(2, B, 10 * B), 2 * B)  # limited by the hit
        self.assertEqual(kvtier.reusable_tokens(1, B, 1), 0)
        self.assertEqual(kvtier.reusable_tokens(0, B, 0), 0)
        self.assertEqual(kvtier.reusable_tokens(4, B, 4 * B, keep_last=0), 4 * B)
        self.assertEqual(reusable_prompt_tokens(4, B, 4 * B), 3 * B)
        with self.assertRaises(ValueError):
            kvtier.reusable_tokens(1, 0, 10)

    def test_leading_hits_stops_at_the_first_non_hit(self):
        H, M, E = kvtier.GetResult.HIT, kvtier.GetResult.MISS, kvtier.GetResult.MISS_FROM_ERROR
        self.assertEqual(kvtier.leading_hits([]), 0)
        self.assertEqual(kvtier.leading_hits([H, H, M, H]), 2)
        self.assertEqual(kvtier.leading_hits([E, H]), 0)
        self.assertEqual(kvtier.leading_hits([H, H, H]), 3)


class ClusterPrefixTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = kvtier.Client(kvtier_cluster.shared_members())
        cls.ns = kvtier.Namespace(kvtier_cluster.unique("arith"), "m", num_layers=2, num_kv_heads=2, head_dim=16,
                                  block_tokens=B)
        cls.tokens = list(range(1000, 1000 + 8 * B))
        fps = kvtier.fingerprints(cls.ns, cls.tokens[: 5 * B])
        cls.client.put(cls.ns, fps, np.zeros((5, cls.ns.block_bytes), np.uint8))

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def hit(self, n_tokens):
        fps = kvtier.fingerprints(self.ns, self.tokens[:n_tokens])
        return len(fps), self.client.lookup(self.ns, fps)

    def test_prompts_around_the_stored_boundary(self):
        self.assertEqual(self.hit(5 * B), (5, 5))
        self.assertEqual(self.hit(5 * B - 1), (4, 4))  # partial 5th block: no fingerprint for it
        self.assertEqual(self.hit(5 * B + 1), (5, 5))
        self.assertEqual(self.hit(6 * B), (6, 5))
        self.assertEqual(self.hit(B - 1), (0, 0))
        # What an engine may skip for each of those prompts.
        for n in (5 * B - 1, 5 * B, 5 * B + 1, 6 * B, 8 * B):
            _, h = self.hit(n)
            skip = kvtier.reusable_tokens(h, B, n)
            self.assertEqual(skip % B, 0)
            self.assertLess(skip, n)
        self.assertEqual(kvtier.reusable_tokens(self.hit(5 * B)[1], B, 5 * B), 4 * B)
        self.assertEqual(kvtier.reusable_tokens(self.hit(5 * B + 1)[1], B, 5 * B + 1), 5 * B)

    def test_a_changed_token_ends_the_prefix_at_its_block(self):
        changed = list(self.tokens[: 5 * B])
        changed[2 * B + 3] += 1  # inside block 2
        fps = kvtier.fingerprints(self.ns, changed)
        self.assertEqual(self.client.lookup(self.ns, fps), 2)
        detail = self.client.lookup_detail(self.ns, fps)
        self.assertEqual(detail.present, [True, True, False, False, False])  # the chain: all later blocks differ


if __name__ == "__main__":
    unittest.main()
