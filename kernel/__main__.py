"""`python -m kernel -f {connection_file}`: what kernel.json's argv runs."""

from ipykernel.kernelapp import IPKernelApp

from .kernel import SandboxKernel

if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=SandboxKernel)
