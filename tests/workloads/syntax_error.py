"""A training script that does not compile (deliberate syntax error)."""
import torch


def main(:
    model = torch.nn.Linear(4, 2)
    print(model)


if __name__ == "__main__":
    main()
