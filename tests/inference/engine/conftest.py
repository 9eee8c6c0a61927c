import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # the tiny model's matmuls are far smaller than thread start-up; shared CI cores make it worse
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
