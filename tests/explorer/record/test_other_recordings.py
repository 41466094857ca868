"""Ops that read a deferred tensor of another recording (note [Reading another recording])."""

import gc
import re
import threading

import pytest
import torch
from torch import nn

from explorer import (
    DeferredInitError,
    MaterializationError,
    deferred_init,
    is_deferred,
    materialize_module,
    materialize_tensor,
    to_fx,
)


class Teacher(nn.Module):
    def __init__(self, offset: torch.Tensor | None = None) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(3, 2)
        if offset is not None:
            with torch.no_grad():
                self.b.bias.add_(offset)


class Student(nn.Module):
    """Reads a teacher while it is built: a copy, a value read, then draws of its own."""

    def __init__(self, teacher: Teacher) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        with torch.no_grad():
            self.a.weight.copy_(teacher.a.weight * 0.5)
        self.scale = float((teacher.b.weight**2).sum().item())
        self.c = nn.Linear(2, 2)


def _values(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.state_dict())


def _assert_equal(got: nn.Module, want: nn.Module) -> None:
    got_values, want_values = _values(got), _values(want)
    assert list(got_values) == list(want_values)
    assert [name for name in want_values if not torch.equal(got_values[name], want_values[name])] == []


def test_load_state_dict_between_deferred_models_materializes_to_eager_values():
    torch.manual_seed(0)
    teacher, student = Teacher(), Teacher()
    student.load_state_dict(teacher.state_dict())
    torch.manual_seed(0)
    deferred_teacher, deferred_student = deferred_init(Teacher), deferred_init(Teacher)
    deferred_student.load_state_dict(deferred_teacher.state_dict())
    assert is_deferred(deferred_student.a.weight)
    _assert_equal(materialize_module(deferred_student), student)  # the teacher is still deferred
    assert is_deferred(deferred_teacher.a.weight)
    _assert_equal(materialize_module(deferred_teacher), teacher)


def test_a_read_keeps_the_value_the_other_model_had_then():
    torch.manual_seed(0)
    teacher, student = Teacher(), Teacher()
    student.load_state_dict(teacher.state_dict())
    nn.init.zeros_(teacher.a.weight)  # after the copy: the student keeps the value from before
    torch.manual_seed(0)
    deferred_teacher, deferred_student = deferred_init(Teacher), deferred_init(Teacher)
    deferred_student.load_state_dict(deferred_teacher.state_dict())
    nn.init.zeros_(deferred_teacher.a.weight)
    _assert_equal(materialize_module(deferred_teacher), teacher)
    _assert_equal(materialize_module(deferred_student), student)
    assert not torch.equal(deferred_student.a.weight, deferred_teacher.a.weight)


def test_a_constructor_reading_another_deferred_model_matches_eager_after_that_model_is_gone():
    torch.manual_seed(0)
    student = Student(Teacher())
    torch.manual_seed(0)
    deferred_student = deferred_init(Student, deferred_init(Teacher))
    assert deferred_student.scale == student.scale  # a value read through the other recording
    gc.collect()  # the teacher is gone; the student's recording keeps what it read alive
    _assert_equal(materialize_module(deferred_student), student)


def test_stack_module_state_of_a_deferred_ensemble_equals_eager():
    from torch.func import stack_module_state

    torch.manual_seed(0)
    want, _ = stack_module_state([Teacher() for _ in range(3)])
    torch.manual_seed(0)
    got, _ = stack_module_state([deferred_init(Teacher) for _ in range(3)])
    assert list(got) == list(want)
    for name in want:
        assert torch.equal(materialize_tensor(got[name]), want[name]), name


def test_reads_follow_the_device_map_and_rng_of_the_materialization():
    with torch.device("cuda"):  # recorded on cuda, on a machine that may have none
        teacher, student = deferred_init(Teacher), deferred_init(Teacher)
    student.load_state_dict(teacher.state_dict())
    assert student.a.weight.device == torch.device("cuda", 0)
    materialize_module(student, device={"cuda": "cpu"}, rng="fast")
    materialize_module(teacher, device={"cuda": "cpu"}, rng="fast")
    assert student.a.weight.device == torch.device("cpu")
    _assert_equal(student, teacher)


def test_writing_into_another_recordings_tensor_is_refused():
    teacher = deferred_init(Teacher)

    class Writer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            with torch.no_grad():
                teacher.a.weight.copy_(torch.ones(3, 4))

    with pytest.raises(DeferredInitError) as error:
        deferred_init(Writer)
    assert re.fullmatch(
        re.escape(f"a fake tensor from another deferred_init graph was used at {__file__}:")
        + r"\d+"
        + re.escape(
            " in __init__ as aten.copy_.default's 'self', which it writes or views; tensors of two deferred "
            "recordings cannot be mixed in one op. Materialize one of them first (explorer.materialize_module), "
            "or build the new modules inside `with explorer.deferred(model):` so that they share the model's "
            "recording"
        ),
        str(error.value),
    )
    assert materialize_module(teacher).a.weight.shape == (3, 4)  # the teacher's recording is untouched


class Viewer(nn.Module):
    """Keeps a view of a teacher's weight and zeroes the teacher's bias: ops on the teacher alone."""

    def __init__(self, teacher: Teacher) -> None:
        super().__init__()
        self.own = nn.Linear(2, 2)
        self.register_buffer("flat", teacher.a.weight.view(-1))  # eager shares the teacher's memory
        with torch.no_grad():
            teacher.b.bias.zero_()
        self.last = nn.Linear(2, 2)


def test_ops_on_another_models_tensors_alone_are_that_models_ops_and_keep_its_memory():
    torch.manual_seed(0)
    teacher = Teacher()
    viewer = Viewer(teacher)
    torch.manual_seed(0)
    deferred_teacher = deferred_init(Teacher)
    deferred_viewer = deferred_init(Viewer, deferred_teacher)
    _assert_equal(materialize_module(deferred_viewer), viewer)
    _assert_equal(materialize_module(deferred_teacher), teacher)
    shared = deferred_viewer.flat.untyped_storage().data_ptr() == deferred_teacher.a.weight.untyped_storage().data_ptr()
    assert shared and viewer.flat.untyped_storage().data_ptr() == teacher.a.weight.untyped_storage().data_ptr()


def test_a_random_op_on_another_models_tensor_inside_a_constructor_is_refused():
    teacher = deferred_init(Teacher)

    class Drawer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            nn.init.normal_(teacher.a.weight)  # eager's draw would come in this constructor's order

    with pytest.raises(DeferredInitError, match=r"as aten\.normal_\.default's 'self', which it writes or views"):
        deferred_init(Drawer)


def test_a_failed_read_names_it_and_leaves_the_reader_deferred():
    offset = torch.zeros(2)
    teacher = deferred_init(Teacher, offset)
    student = deferred_init(Teacher)
    student.load_state_dict(teacher.state_dict())
    offset.add_(1)  # the teacher's recording read this caller's tensor, which changed since
    with pytest.raises(MaterializationError) as error:
        materialize_module(student)
    message = str(error.value)
    assert message.startswith("the external tensor float32[2] on cpu read by aten.add_.Tensor at ")
    assert "was modified in place after deferred_init (version 0, now 1); 'a tensor of another deferred " in message
    assert f"recording, read at {__file__}:" in message
    assert all(is_deferred(tensor) for tensor in student.state_dict().values())


def test_to_fx_refuses_a_recording_that_reads_another():
    teacher = deferred_init(Teacher)
    student = deferred_init(Student, teacher)
    with pytest.raises(MaterializationError) as error:
        to_fx(student)
    assert str(error.value) == (
        "to_fx exports one recorded initialization, but this one reads a tensor of another deferred "
        "recording (load_state_dict or a copy between two deferred models); materialize_module gives "
        "the same values"
    )


def test_two_recordings_that_read_each_other_materialize_on_two_threads_at_once(monkeypatch):
    # note [Recordings that read each other]: each thread holds its own graph's lock when it needs
    # the other's, unless the other recording is read first
    torch.manual_seed(0)
    teacher = Teacher()
    student = Student(teacher)
    with torch.no_grad():
        teacher.a.bias.add_(student.a.bias)
    torch.manual_seed(0)
    deferred_teacher = deferred_init(Teacher)
    deferred_student = deferred_init(Student, deferred_teacher)
    with torch.no_grad():
        deferred_teacher.a.bias.add_(deferred_student.a.bias)  # now each reads the other

    from explorer.replay.replay import Replay

    both_started = threading.Barrier(2, timeout=20)
    started = threading.local()
    read_others = Replay._read_other_recordings

    def read_others_after_both_started(self, ops):  # the two threads' first reads, side by side
        if not getattr(started, "done", False):
            started.done = True
            both_started.wait()
        return read_others(self, ops)

    monkeypatch.setattr(Replay, "_read_other_recordings", read_others_after_both_started)
    failures: list[BaseException] = []

    def materialize(module: nn.Module) -> None:
        try:
            materialize_module(module)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            failures.append(error)

    threads = [threading.Thread(target=materialize, args=(m,), daemon=True) for m in (deferred_teacher, deferred_student)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [thread.is_alive() for thread in threads] == [False, False], "the two materializations deadlocked"
    assert failures == []
    _assert_equal(deferred_teacher, teacher)
    _assert_equal(deferred_student, student)
