"""ImageDataModule: labelled images turned into the model's pixel tensors once, batched for training and evaluation."""

import hashlib

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from headprune.tasks.vision.config import SPLITS, ImageDataConfig
from headprune.tasks.vision.image_sources import SOURCE_READERS


class ImageTensors(Dataset):
    """Pixel tensors (N, C, H, W) and labels (N,); items carry their index so results go back in order."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor, fingerprints: list[str]):
        self.pixels, self.labels, self.fingerprints = pixels, labels, fingerprints

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.pixels[i], "labels": self.labels[i], "idx": i}


def to_tensors(images: list, labels: list[int], processor, channels: int) -> ImageTensors:
    """Run the image processor over the images (RGB) and fit the channels to the model's (RGB kept, else the first repeated)."""
    rgb = [image.convert("RGB") for image in images]
    fingerprints = [  # a hash of each image's pixels and its label
        hashlib.sha256(image.tobytes() + f"{image.size}:{label}".encode()).hexdigest()[:16] for image, label in zip(rgb, labels)
    ]
    if not images:
        size = processor.size
        return ImageTensors(torch.zeros(0, channels, size["height"], size["width"]), torch.zeros(0, dtype=torch.long), [])
    pixels = processor(images=rgb, return_tensors="pt")["pixel_values"].float()  # (N, 3, H, W)
    if pixels.shape[1] != channels:  # a grayscale-like model: the first channel repeated
        pixels = pixels[:, :1].repeat(1, channels, 1, 1)
    return ImageTensors(pixels, torch.tensor(labels, dtype=torch.long), fingerprints)


class ImageDataModule(L.LightningDataModule):
    """The train / importance / eval splits of one image source as model inputs."""

    splits = SPLITS
    eval_splits = ("eval",)
    collate = staticmethod(default_collate)  # pixel_values (B, C, H, W), labels (B,), idx (B,)

    def __init__(self, config: ImageDataConfig, processor, channels: int, num_labels: int):
        super().__init__()
        self.config, self.processor, self.channels, self.num_labels = config, processor, channels, num_labels
        self.datasets: dict[str, ImageTensors] = {}

    def setup(self, stage: str | None = None) -> None:
        """Read the source once, apply the limits, check the labels fit the model's classes, make the tensors."""
        if self.datasets:
            return
        parts = SOURCE_READERS[self.config.source](self.config)
        limits = {"train": self.config.limit_train, "eval": self.config.limit_eval}
        for split in SPLITS:
            images, labels = (values[: limits.get(split)] for values in parts[split])  # no limit: all
            if labels and max(labels) >= self.num_labels:
                raise ValueError(
                    f"the {split} images have class {max(labels)}, but the model has model.num_labels={self.num_labels} "
                    f"classes: set model.num_labels={max(labels) + 1} or more"
                )
            self.datasets[split] = to_tensors(images, labels, self.processor, self.channels)

    def dataset(self, split: str) -> ImageTensors:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}: the image task has {list(self.splits)}")
        self.setup()
        return self.datasets[split]

    def loader(self, split: str, batch_size: int | None = None, shuffle: bool = False) -> DataLoader:
        """Batches of ``split`` in dataset order (training: shuffled by the seed)."""
        size = batch_size or (self.config.batch_size if split == "train" else self.config.eval_batch_size)
        generator = torch.Generator().manual_seed(self.config.seed) if shuffle else None
        return DataLoader(self.dataset(split), batch_size=int(size), shuffle=shuffle, generator=generator)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> list[DataLoader]:
        return [self.loader(split) for split in self.eval_splits]

    def describe(self) -> str:
        """One line: the source and the size of each split."""
        sizes = ", ".join(f"{split} {len(self.dataset(split))}" for split in SPLITS)
        size = self.processor.size
        return f"images from {self.config.source}: {sizes} ({self.channels} channels, {size['height']}x{size['width']})"
