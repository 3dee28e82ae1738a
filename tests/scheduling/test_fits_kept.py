"""node_rooms_kept: a caller checking many submits at once reads the nodes' sizes once."""

from __future__ import annotations

from scheduling.fits import node_rooms, node_rooms_kept
from tests.scheduling.conftest import make_nodes


def test_inside_the_block_each_pool_is_read_once_and_after_it_afresh(
    pool, django_assert_num_queries
):
    make_nodes(pool, 2, 4)
    with node_rooms_kept():
        with django_assert_num_queries(1):
            first = node_rooms(["a100"], "")
            assert node_rooms(["a100"], "") == first
        make_nodes(pool, 1, 8)  # kept as the block began
        assert len(node_rooms(["a100"], "")) == 2
        with django_assert_num_queries(1):  # another request: read once too
            node_rooms([], "")
    rooms = node_rooms(["a100"], "")
    assert sorted(room.gpus for room in rooms) == [4, 4, 8]
