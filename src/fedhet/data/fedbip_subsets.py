"""The class subsets FedBiP's experiments use (Chen et al., CVPR 2025, §5.1; spec fedbip.md), as datasets:

- `domainnet_fedbip`: DomainNet's six domains with the 10 classes the paper takes from FGL (Zhang et al., 2023):
  airplane, axe, basketball, bicycle, bird, bracelet, clock, flower, pizza, strawberry (the official code's
  config.py, `args.categories` for domainnet, sorted as it sorts them);
- `officehome_fedbip`: Office-Home's four domains with the official code's 20 `selected_classes` (config.py),
  sorted.

Both read the same image folders as `domainnet` / `officehome` (fedhet.data.images): a full copy of DomainNet or
Office-Home under the data root serves them, other class folders are ignored. With `data.download: true` a missing
domain is fetched from the Hugging Face hub (Flower Datasets' copies) into a folder of its own,
`DomainNet_FedBiP/` or `OfficeHome_FedBiP/`, holding only these classes (it is read first), so the FedBN subset
that `domainnet` downloads is never mixed with this one.
"""

from __future__ import annotations

from fedhet.data.images import DOMAINNET_DOMAINS, OFFICEHOME_DOMAINS, _folder_loader
from fedhet.data.registry import DatasetSpec, register_dataset

DOMAINNET_FEDBIP_CLASSES = tuple(sorted(("airplane", "clock", "axe", "basketball", "bicycle", "bird", "strawberry",
                                         "flower", "pizza", "bracelet")))
OFFICEHOME_FEDBIP_CLASSES = tuple(sorted((
    "Marker", "Spoon", "Pencil", "Speaker", "Toys", "Fan", "Hammer", "Notebook", "Telephone", "Sink", "Chair",
    "Fork", "Kettle", "Bucket", "Knives", "Monitor", "Mop", "Oven", "Pen", "Couch")))
_SUBSET = "the class subset of FedBiP (Chen et al., CVPR 2025; HaokunChen245/FedBiP config.py)"
_DN_SRC = f"DomainNet (Peng et al., ICCV 2019, http://ai.bu.edu/M3SDA/), {_SUBSET}"
_OH_SRC = f"Office-Home (Venkateswara et al., CVPR 2017, https://www.hemanthdv.org/officeHomeDataset.html), {_SUBSET}"

register_dataset(DatasetSpec(
    name="domainnet_fedbip", domains=DOMAINNET_DOMAINS, classes=DOMAINNET_FEDBIP_CLASSES, modality="image",
    loader=_folder_loader("domainnet_fedbip", ("DomainNet_FedBiP", "DomainNet", "domainnet"),
                          DOMAINNET_FEDBIP_CLASSES, _DN_SRC, hub="flwrlabs/domainnet", domains=DOMAINNET_DOMAINS),
    source=_DN_SRC, layout="DomainNet/<domain>/<class>/*.jpg or DomainNet_FedBiP/<domain>/<class>/*.jpg (what "
    "data.download writes); other class folders are ignored", default_image_size=224,
))
register_dataset(DatasetSpec(
    name="officehome_fedbip", domains=OFFICEHOME_DOMAINS, classes=OFFICEHOME_FEDBIP_CLASSES, modality="image",
    loader=_folder_loader("officehome_fedbip", ("OfficeHome_FedBiP", "OfficeHome", "OfficeHomeDataset_10072016",
                                                "office_home"), OFFICEHOME_FEDBIP_CLASSES, _OH_SRC,
                          aliases={"Real_World": ("Real World", "RealWorld")}, hub="flwrlabs/office-home",
                          domains=OFFICEHOME_DOMAINS),
    source=_OH_SRC, layout="OfficeHome/<domain>/<class>/*.jpg or OfficeHome_FedBiP/<domain>/<class>/*.jpg (what "
    "data.download writes); other class folders are ignored", default_image_size=224,
))
