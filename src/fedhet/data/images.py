"""Image-folder domain datasets: PACS, Office-Home, Office-Caltech10 (images) and DomainNet (FedBN subset).

Each reads `<root>/<Folder>/<domain>/<class>/*.{jpg,png,...}` (an intermediate `images/` folder is allowed,
class folder names match case-insensitively, other folders are ignored). Images are resized to
image_size x image_size when loaded, so a domain lives in memory as one uint8 tensor. PACS may instead be a
`<root>/pacs/<domain>.npz` (x NxHxWx3 uint8, y). None of these has an official test split here.

With `data.download: true` (and a data root), a missing PACS, Office-Home or DomainNet domain is fetched once
from the Hugging Face hub (Flower Datasets' copies `flwrlabs/pacs`, `flwrlabs/office-home`,
`flwrlabs/domainnet`; needs the optional package `datasets`) and written as image folders
`<root>/<Folder>/<domain>/<class>/*` (all missing domains in one pass; DomainNet: only the 10 FedBN classes).
"""

from __future__ import annotations

from pathlib import Path

from fedhet.data.download import download_hf_image_folders, need_root
from fedhet.data.files import missing_dataset, read_image_folder, read_image_npz
from fedhet.data.registry import DatasetSpec, DomainData, LoadContext, Loader, register_dataset

PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
OFFICEHOME_CLASSES = tuple(sorted((
    "Alarm_Clock", "Backpack", "Batteries", "Bed", "Bike", "Bottle", "Bucket", "Calculator", "Calendar",
    "Candles", "Chair", "Clipboards", "Computer", "Couch", "Curtains", "Desk_Lamp", "Drill", "Eraser",
    "Exit_Sign", "Fan", "File_Cabinet", "Flipflops", "Flowers", "Folder", "Fork", "Glasses", "Hammer",
    "Helmet", "Kettle", "Keyboard", "Knives", "Lamp_Shade", "Laptop", "Marker", "Monitor", "Mop", "Mouse",
    "Mug", "Notebook", "Oven", "Pan", "Paper_Clip", "Pen", "Pencil", "Postit_Notes", "Printer", "Push_Pin",
    "Radio", "Refrigerator", "Ruler", "Scissors", "Screwdriver", "Shelf", "Sink", "Sneakers", "Soda",
    "Speaker", "Spoon", "TV", "Table", "Telephone", "ToothBrush", "Toys", "Trash_Can", "Webcam",
)))
OFFICE_CALTECH_CLASSES = ("back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer",
                          "monitor", "mouse", "mug", "projector")
DOMAINNET_CLASSES = ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill",
                     "wine_glass", "zebra")
PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
OFFICEHOME_DOMAINS = ("Art", "Clipart", "Product", "Real_World")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")


def _domain_dir(root: Path, folders: tuple[str, ...], domain: str, aliases: tuple[str, ...]) -> Path | None:
    for folder in folders:
        for name in (domain, *aliases):
            for cand in (root / folder / name, root / folder / "kfold" / name):
                if cand.is_dir():
                    return cand
    return None


def _folder_loader(dataset: str, folders: tuple[str, ...], classes: tuple[str, ...], source: str,
                   aliases: dict[str, tuple[str, ...]] | None = None, npz_folder: str | None = None,
                   hub: str | None = None, domains: tuple[str, ...] = ()) -> Loader:
    """A loader reading `<root>/<folder>/<domain>/<class>/*` (or `<root>/<npz_folder>/<domain>.npz`).

    With a `hub` repository and `data.download: true`, missing domains are fetched from the Hugging Face hub
    into `<root>/<folders[0]>/<domain>/<class>/*` first.
    """
    if hub is not None:
        source = f"{source}; or data.download=true (Hugging Face hub {hub}, needs `pip install datasets`)"

    def load(ctx: LoadContext, domain: str) -> DomainData:
        if ctx.download and hub is not None and ctx.root is None:
            raise need_root(dataset, domain, f"Hugging Face hub {hub}")
        looked: list[Path] = []
        if ctx.root is not None:
            if npz_folder is not None:
                npz = ctx.root / npz_folder / f"{domain}.npz"
                looked.append(npz)
                if npz.is_file():
                    return read_image_npz(npz)
            alias = (aliases or {}).get(domain, ())
            looked += [ctx.root / f / d for f in folders for d in (domain, *alias)]
            found = _domain_dir(ctx.root, folders, domain, alias)
            if found is None and ctx.download and hub is not None:
                # one pass over the hub data writes every domain not yet on disk (this one included)
                missing = [d for d in domains if d != domain and
                           _domain_dir(ctx.root, folders, d, (aliases or {}).get(d, ())) is None]
                download_hf_image_folders(dataset, hub, ctx.root / folders[0], [domain, *missing], classes)
                found = _domain_dir(ctx.root, folders, domain, alias)
            if found is not None:
                x, y = read_image_folder(found, classes, ctx.image_size)
                return DomainData(x, y, note=str(found))
        raise missing_dataset(dataset, domain, ctx.root, looked, source, f"{folders[0]}/{domain}/<class>/*.jpg")

    return load


_PACS_SRC = ("Li et al., ICCV 2017, https://domaingeneralization.github.io/ (images: "
             "https://drive.google.com/drive/folders/0B6x7gtvErXgfUU1WcGY5SzdwZVk)")
_OH_SRC = "Venkateswara et al., CVPR 2017, https://www.hemanthdv.org/officeHomeDataset.html"
_OC_SRC = ("Gong et al., CVPR 2012 (Office: https://faculty.cc.gatech.edu/~judy/domainadapt/ ; Caltech-256: "
           "https://data.caltech.edu/records/nyy15-4j048); FedBN's split: https://github.com/med-air/FedBN")
_DN_SRC = ("Peng et al., ICCV 2019, http://ai.bu.edu/M3SDA/ (FedBN's 10-class subset: "
           "https://github.com/med-air/FedBN)")

register_dataset(DatasetSpec(
    name="pacs", domains=PACS_DOMAINS, classes=PACS_CLASSES, modality="image",
    loader=_folder_loader("pacs", ("PACS", "pacs"), PACS_CLASSES, _PACS_SRC, npz_folder="pacs",
                          hub="flwrlabs/pacs", domains=PACS_DOMAINS),
    source=_PACS_SRC, layout="pacs/<domain>.npz (x, y) or PACS/<domain>/<class>/*.jpg (what data.download writes)",
    default_image_size=224,
))
register_dataset(DatasetSpec(
    name="officehome", domains=OFFICEHOME_DOMAINS, classes=OFFICEHOME_CLASSES,
    modality="image",
    loader=_folder_loader("officehome", ("OfficeHome", "OfficeHomeDataset_10072016", "office_home"),
                          OFFICEHOME_CLASSES, _OH_SRC, aliases={"Real_World": ("Real World", "RealWorld")},
                          hub="flwrlabs/office-home", domains=OFFICEHOME_DOMAINS),
    source=_OH_SRC, layout="OfficeHome/<domain>/<class>/*.jpg", default_image_size=224,
))
register_dataset(DatasetSpec(
    name="office_caltech10", domains=("amazon", "caltech", "dslr", "webcam"), classes=OFFICE_CALTECH_CLASSES,
    modality="image",
    loader=_folder_loader("office_caltech10", ("office_caltech10", "office_caltech_10", "office"),
                          OFFICE_CALTECH_CLASSES, _OC_SRC, aliases={"caltech": ("caltech10", "Caltech10")}),
    source=_OC_SRC, layout="office_caltech10/<domain>/<class>/*.jpg", default_image_size=224,
))
register_dataset(DatasetSpec(
    name="domainnet", domains=DOMAINNET_DOMAINS,
    classes=DOMAINNET_CLASSES, modality="image",
    loader=_folder_loader("domainnet", ("DomainNet", "domainnet"), DOMAINNET_CLASSES, _DN_SRC,
                          hub="flwrlabs/domainnet", domains=DOMAINNET_DOMAINS),
    source=_DN_SRC, layout="DomainNet/<domain>/<class>/*.jpg (other class folders are ignored)",
    default_image_size=224,
))
