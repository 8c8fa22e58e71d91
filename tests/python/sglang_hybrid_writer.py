"""A writer process for test_sglang_adapter.py's kill tests: backs up hybrid prompts through
kvtier.adapters.sglang as SGLang's hybrid controller does (extra pools, then KV) until it is killed.

Usage: sglang_hybrid_writer.py MEMBERS TENANT MODE
  MODE "pause":  prompt 0 (6 pages) in full, then the extra-pool pages of its 9-page extension (seed 1);
                 prints "paused" and waits on stdin
                 (forever: the test kills it there, between those extra pages and their KV pages).
  MODE "stream": prompts 0, 1, 2, ... in full, printing "done J" after each, until killed.
"""

import sys

import sglang_standin as s


def main():
    members, tenant, mode = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    controller = s.make_hybrid_controller(s.hybrid_extra_config(members, tenant), pages=4096)
    if mode == "pause":
        s.write_hybrid_prompt(controller, s.hybrid_prompt(0), seed=0)

        def pause():
            print("paused", flush=True)
            sys.stdin.readline()

        s.write_hybrid_prompt(controller, s.hybrid_prompt(0, pages=9), seed=1, pause=pause)
        print("unpaused", flush=True)
        return
    j = 0
    while True:
        _, completed = s.write_hybrid_prompt(controller, s.hybrid_prompt(j), seed=j)
        print(f"done {j} {completed}", flush=True)
        j += 1


if __name__ == "__main__":
    main()
