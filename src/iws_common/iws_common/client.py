"""A ROS client node spun by a background thread, for tools, benchmarks and tests.

Tools such as `iws bench`, `iws demo` and the tests talk to a backend from another process; this
keeps their plumbing (a private context, a spin thread, waiting for messages and services) in one
place. Shut down in the order that does not abort: rclpy.shutdown first, then join the thread.
"""
from __future__ import annotations

import os
import threading
import time

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor

from iws_common import qos


class RosClient:
    """A client node in the test process, spun by a background thread."""

    def __init__(self, domain_id: int | None = None, name: str = "iws_client"):
        if domain_id is not None:
            # A private domain is shared with nodes started by iws_common.processes, which discover
            # on localhost only; DDS participants must agree on that to see each other.
            os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # shutdown races end the spin; the test's own asserts report failures
            pass

    def collect(self, msg_type, topic: str, qos_profile=qos.STATE) -> list:
        """Subscribe and return the list that received messages are appended to."""
        received: list = []
        self.node.create_subscription(msg_type, topic, received.append, qos_profile)
        return received

    def wait_for(self, received: list, count: int = 1, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while len(received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(received) < count:
            raise TimeoutError(f"got {len(received)} of {count} messages within {timeout} s")
        return received

    def call(self, srv_type, name: str, request, timeout: float = 30.0):
        client = self.node.create_client(srv_type, name)
        if not client.wait_for_service(timeout_sec=timeout):
            raise TimeoutError(f"service {name} not available within {timeout} s")
        future = client.call_async(request)
        deadline = time.monotonic() + timeout
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not future.done():
            raise TimeoutError(f"service {name} did not answer within {timeout} s")
        self.node.destroy_client(client)
        return future.result()

    def publisher(self, msg_type, topic: str, qos_profile=qos.COMMAND):
        return self.node.create_publisher(msg_type, topic, qos_profile)

    def wait_for_subscribers(self, publisher, count: int = 1, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while publisher.get_subscription_count() < count and time.monotonic() < deadline:
            time.sleep(0.02)
        if publisher.get_subscription_count() < count:
            raise TimeoutError(f"no subscriber on {publisher.topic_name} within {timeout} s")

    def close(self) -> None:
        rclpy.shutdown(context=self.context)
        self._thread.join(5)
        self.node.destroy_node()
