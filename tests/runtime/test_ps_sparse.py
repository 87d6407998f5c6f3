"""The row-sparse parts of parameter-server mode (embedding tables), without processes.

Aspects:
- layout: cuts fall on row boundaries of every table, the pieces still tile the model in
  server order, a table may straddle partitions (hypothesis); a piece splits into its
  dense ranges and its table segments;
- partition: row pushes of several contributors are summed (the same row from two adds
  up), rows nobody pushed keep their parameters and, with momentum, their velocity (lazy
  momentum), dense elements follow the dense rule beside them; a row push counts its whole
  range toward completion, once;
- bad input is refused naming the field: a start or stop off a row boundary, row numbers
  out of range, unsorted or miscounted, elements that do not match the rows, a dense push
  into a table, tables that overlap;
- transport: through real gRPC servers, a table straddling two partitions is pushed and
  pulled by row (only the named rows move), and a pull without rows fetches everything;
  pulled rows are written where they belong as they come, and a reply with more or fewer
  rows than asked for (or a partial row) is an error naming the server.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_runtime.ps.layout import Piece, Table, laying_out, splitting
from trainer_runtime.ps.partition import Partition, PartitionError
from trainer_runtime.ps.serving import ParameterServer, ParameterService
from trainer_runtime.ps.snapshots import SnapshotDirectory
from trainer_runtime.ps.transport import Links, ServerError, ServerLink

from .harness import CREDENTIALS, VERIFIER

#: 2 dense elements, a table of 5 rows of 3, 1 dense element: 18 elements.
TABLE = Table(2, 5, 3)
SIZE = 18


@settings(max_examples=80, deadline=None)
@given(
    dense=st.integers(0, 7),
    rows=st.integers(1, 9),
    length=st.integers(1, 5),
    tail=st.integers(0, 7),
    servers=st.integers(1, 5),
)
def test_cuts_fall_on_row_boundaries_and_tile_the_model(
    dense: int, rows: int, length: int, tail: int, servers: int
) -> None:
    table = Table(dense, rows, length)
    size = table.stop + tail
    pieces = laying_out(size, [(str(i), "") for i in range(servers)], [table])
    assert pieces[0].start == 0 and pieces[-1].stop == size
    assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))
    for piece in pieces:
        for cut in (piece.start, piece.stop):
            assert not table.start < cut < table.stop or (cut - table.start) % length == 0
    assert len(pieces) <= servers and all(len(piece) > 0 for piece in pieces)
    if rows >= 2 * servers and not dense and not tail:  # rows enough: every server has some
        assert len(pieces) == servers


def test_a_table_straddles_partitions_by_whole_rows() -> None:
    pieces = laying_out(SIZE, [("a", ""), ("b", "")], [TABLE])
    assert [(p.start, p.stop) for p in pieces] == [(0, 8), (8, 18)]  # 9 snapped to row 2
    dense, segments = splitting(pieces[1], [TABLE])
    assert dense == [(17, 18)]
    assert [(s.start, s.stop, s.first_row) for s in segments] == [(8, 17, 2)]
    assert splitting(Piece("", "", 0, 8), [TABLE])[0] == [(0, 2)]
    with pytest.raises(ValueError, match="overlap"):
        laying_out(SIZE, [("a", "")], [TABLE, Table(4, 2, 3)])


def adopted(start: int = 0, stop: int = SIZE, momentum: float = 0.0) -> Partition:
    part = Partition()
    params = np.arange(start, stop, dtype=np.float64)
    state = (params, np.zeros_like(params))
    part.adopting(1, start, stop, SIZE, "float64", 1.0, momentum, 0, 0, state, (TABLE,))
    return part


def rows_push(
    part: Partition,
    contributor: int,
    rows: list[int],
    values: list[float],
    expected: int = 2,
    span: tuple[int, int] = (2, 17),
) -> None:
    numbers = np.array(rows, dtype="<i8").tobytes()
    data = np.array(values, dtype=np.float64).tobytes()
    part.adding_rows(1, contributor, expected, *span, numbers, len(rows), data)


def dense_push(part: Partition, contributor: int, values: list[float]) -> None:
    data = np.array(values[:2], dtype=np.float64).tobytes()
    part.adding(1, contributor, 2, 0, data)
    part.adding(1, contributor, 2, 17, np.array(values[2:], dtype=np.float64).tobytes())


def test_row_pushes_are_summed_and_untouched_rows_stay() -> None:
    part = adopted()
    dense_push(part, 0, [1, 1, 1])
    rows_push(part, 0, [1, 3], [1, 1, 1, 2, 2, 2])
    assert not part.complete(1), "contributor 1 is missing"
    dense_push(part, 1, [0, 0, 1])
    rows_push(part, 1, [3], [10, 10, 10])
    assert part.complete(1) and part.deciding(1)
    expected = np.arange(SIZE, dtype=np.float64)
    expected[[0, 1, 17]] -= [1, 1, 2]
    expected[5:8] -= 1  # row 1
    expected[11:14] -= 12  # row 3, both contributors
    np.testing.assert_array_equal(part.params, expected)
    again = adopted()
    for contributor in (0, 1):  # no rows: the whole table counts, as zero gradient
        dense_push(again, contributor, [1, 1, 1])
        rows_push(again, contributor, [], [])
    with pytest.raises(PartitionError, match="twice"):
        rows_push(again, 0, [], [])
    assert again.deciding(1)
    np.testing.assert_array_equal(again.params[2:17], np.arange(2, 17))


def test_rows_take_the_rate_whatever_buffer_they_came_in() -> None:
    part = adopted()
    part.lr = 0.5
    part.adding(1, 0, 1, 0, np.ones(2).tobytes())
    part.adding(1, 0, 1, 17, np.ones(1).tobytes())
    numbers = np.array([1], dtype="<i8").tobytes()
    part.adding_rows(1, 0, 1, 2, 17, numbers, 1, np.full(3, 2.0).tobytes())  # read-only bytes
    assert part.deciding(1)
    np.testing.assert_array_equal(part.params[5:8], [4, 5, 6])


def test_momentum_is_lazy_on_table_rows() -> None:
    part = adopted(momentum=0.5)
    for step in (1, 2):
        part.adding(step, 0, 1, 0, np.ones(2).tobytes())
        part.adding(step, 0, 1, 17, np.ones(1).tobytes())
        numbers = np.array([0] if step == 1 else [4], dtype="<i8").tobytes()
        part.adding_rows(step, 0, 1, 2, 17, numbers, 1, np.ones(3).tobytes())
        assert part.deciding(step)
    velocity = part.velocity
    np.testing.assert_array_equal(velocity[[0, 1, 17]], [1.5, 1.5, 1.5])  # dense: decays
    np.testing.assert_array_equal(velocity[2:5], [1, 1, 1])  # row 0: touched at step 1 only
    np.testing.assert_array_equal(velocity[14:17], [1, 1, 1])  # row 4: at step 2 only
    np.testing.assert_array_equal(velocity[5:14], np.zeros(9))


def test_a_partition_holding_part_of_a_table_takes_its_rows_only() -> None:
    part = adopted(8, 18)  # rows 2..4 of the table, then one dense element
    part.adding(1, 0, 1, 17, np.ones(1).tobytes())
    part.adding_rows(1, 0, 1, 8, 17, np.array([2], dtype="<i8").tobytes(), 1, np.ones(3).tobytes())
    assert part.deciding(1)
    np.testing.assert_array_equal(part.params[-4:], [13, 14, 15, 16])  # row 4 and the dense
    np.testing.assert_array_equal(part.params[6:9], [13, 14, 15])
    np.testing.assert_array_equal(
        part.reading_rows(8, 17, np.array([0], "<i8").tobytes()), [[8, 9, 10]]
    )
    with pytest.raises(PartitionError, match="start 5"):
        part.reading_rows(5, 8, b"")


@pytest.mark.parametrize(
    ("span", "rows", "values", "field"),
    [
        ((3, 17), [0], [1, 1, 1], "start 3 is not a row boundary"),
        ((2, 16), [0], [1, 1, 1], "stop 16"),
        ((2, 8), [2], [1, 1, 1], "rows: row numbers must lie in 0..1"),
        ((2, 17), [3, 1], [1] * 6, "rows: row numbers must be unique and ascending"),
        ((2, 17), [1, 2], [1, 1, 1], "rows: 3 elements sent for 2 rows of 3"),
        ((0, 2), [0], [1, 1, 1], "start 0 is not inside a table segment"),
    ],
)
def test_bad_row_pushes_name_the_field(
    span: tuple[int, int], rows: list[int], values: list[float], field: str
) -> None:
    part = adopted()
    with pytest.raises(PartitionError, match=field):
        rows_push(part, 0, rows, values, span=span)
    numbers = np.array([0], dtype="<i8").tobytes()
    with pytest.raises(PartitionError, match="rows: 8 bytes of row numbers, expected 2"):
        part.adding_rows(1, 0, 1, 2, 17, numbers, 2, np.ones(3).tobytes())
    with pytest.raises(PartitionError, match="PushRows"):
        part.adding(1, 0, 1, 1, np.ones(2).tobytes())
    assert part.buffers == {}, "a refused push changes nothing"


def test_rows_move_through_real_servers_by_row(tmp_path: Path) -> None:
    pieces_servers = []
    try:
        layout = laying_out(SIZE, [("a", ""), ("b", "")], [TABLE])
        for piece in layout:
            service = ParameterService(SnapshotDirectory(tmp_path), VERIFIER)
            params = np.arange(piece.start, piece.stop, dtype=np.float64)
            state = (params, np.zeros_like(params))
            service.partition.adopting(
                1, piece.start, piece.stop, SIZE, "float64", 1.0, 0.0, 0, 0, state, (TABLE,)
            )
            pieces_servers.append(ParameterServer(service).start())
        servers = [(str(i), s.address) for i, s in enumerate(pieces_servers)]
        pieces = laying_out(SIZE, servers, [TABLE])
        links = Links(CREDENTIALS.worker("w0"), 2)
        touched = {TABLE: np.array([0, 2, 4], dtype=np.int64)}  # rows on both partitions
        gradient = np.full(SIZE, 7.0)
        gradient[2:17] = np.repeat(np.arange(5.0), 3)
        header = {"generation": 1, "step": 1, "contributor": 0, "contributors": 1}
        links.pushing(pieces, header, gradient, [TABLE], touched)
        assert all(reply.done for reply in links.stepping(pieces, "Apply", 1, 1, 5.0))
        values = np.full(SIZE, -1.0)
        assert links.pulling(pieces, 1, 1, 5.0, values, [TABLE], touched) == 1
        expected = np.arange(SIZE, dtype=np.float64)
        expected[[0, 1, 17]] -= 7
        expected[8:11] -= 2  # row 2
        expected[14:17] -= 4  # row 4 (row 0's gradient is 0)
        pulled_rows = np.r_[2:5, 8:11, 14:17]
        np.testing.assert_array_equal(values[pulled_rows], expected[pulled_rows])
        np.testing.assert_array_equal(values[[0, 1, 17]], expected[[0, 1, 17]])
        assert (values[np.r_[5:8, 11:14]] == -1).all(), "rows not named are not pulled"
        assert links.pulling(pieces, 1, 1, 5.0, values, [TABLE], None) == 1
        np.testing.assert_array_equal(values, expected)
        links.closing()
    finally:
        for server in pieces_servers:
            server.stop(0.1)


def test_pulled_rows_land_where_they_belong_and_a_short_reply_is_an_error() -> None:
    link = ServerLink.__new__(ServerLink)  # no channel: only its reading of a reply
    link.address = "ps-test"
    rows = np.array([1, 3, 4], dtype=np.int64)
    pulled = np.arange(9, dtype=np.float32).reshape(3, 3)
    table = np.zeros((5, 3), dtype=np.float32)
    link.scattering(iter([pulled[:2].tobytes(), pulled[2:].tobytes()]), table, rows)
    np.testing.assert_array_equal(table[rows], pulled)
    np.testing.assert_array_equal(table[[0, 2]], 0)
    for reply in ([pulled[:2].tobytes()], [pulled.tobytes(), pulled[:1].tobytes()],
                  [pulled.tobytes()[:-4]]):  # fmt: skip
        with pytest.raises(ServerError, match="more or less than the 3 rows"):
            link.scattering(iter(reply), np.zeros((5, 3), dtype=np.float32), rows)
