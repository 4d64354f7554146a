"""OpenML regression matrices for the TabPFN v3 retrofit (paper §6.2, B.4, Tables 2 and 7).

``run_matrix`` runs dataset × seed × arm × τ cells into a resumable run folder; ``render`` turns
one or more run folders into Markdown / LaTeX / CSV tables and plots beside the paper's values.
"""

from .data import OFFLINE_STANDINS, Dataset, DatasetUnavailable, load_dataset, load_datasets
from .presets import PRESETS, preset_matrix
from .protocol import PAPER_PROTOCOL, SplitProtocol
from .runner import Matrix, ModelSettings, RunResult, run_matrix
from .store import Cell, FolderBusy, RunFolder, RunMismatch
from .tables import render

__all__ = ["OFFLINE_STANDINS", "Dataset", "DatasetUnavailable", "load_dataset", "load_datasets",
           "PRESETS", "preset_matrix", "PAPER_PROTOCOL", "SplitProtocol", "Matrix",
           "ModelSettings", "RunResult", "run_matrix", "Cell", "FolderBusy", "RunFolder",
           "RunMismatch", "render"]
